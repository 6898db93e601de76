package io.authpipe.keycloak;

import io.authpipe.keycloak.captcha.CaptchaVerifier;
import java.util.List;
import org.jboss.logging.Logger;
import org.keycloak.Config;
import org.keycloak.authentication.Authenticator;
import org.keycloak.models.KeycloakSession;
import org.keycloak.provider.ProviderConfigProperty;

/** {@code authpipe-edge-check}: see {@link EdgeCheckAuthenticator}. */
public final class EdgeCheckAuthenticatorFactory extends AuthpipeAuthenticatorFactory {

  public static final String ID = "authpipe-edge-check";
  private static final Logger LOG = Logger.getLogger(EdgeCheckAuthenticatorFactory.class);
  private static volatile EdgeSettings defaults = new EdgeSettings(
      "http://127.0.0.1:8080", null, 250, true, EdgeSettings.DEFAULT_VERIFIER, 3);
  private volatile CaptchaVerifier verifier;

  static EdgeSettings defaults() {
    return defaults;
  }

  @Override
  public Authenticator create(KeycloakSession session) {
    return new EdgeCheckAuthenticator(defaults, verifier);
  }

  @Override
  public void init(Config.Scope config) {
    try {
      defaults = EdgeSettings.from(config);
    } catch (RuntimeException e) {
      LOG.errorf("authpipe: bad edge settings (%s); using the defaults (%s, fail open)",
          e.getMessage(), defaults.url());
    }
    verifier = loadVerifier(defaults.captchaVerifier(), config);
  }

  /**
   * The verifier class, made with the first it has of: a {@code (String)} constructor given the
   * {@code captcha-key} option (ALTCHA's HMAC key), or, that option unset, a static {@code
   * fromEnvironment()} (ALTCHA: {@code AUTHPIPE_ALTCHA_HMAC_KEY}); a {@code (Config.Scope)}
   * constructor given this SPI's options; a no-argument one.
   */
  static CaptchaVerifier loadVerifier(String className, Config.Scope config) {
    if (className == null || className.isBlank()) {
      return null;
    }
    try {
      Class<?> type = Class.forName(className, true, EdgeCheckAuthenticatorFactory.class.getClassLoader());
      Object made;
      String key = config.get("captcha-key");
      try {
        made = key == null && hasFactory(type)
            ? type.getMethod("fromEnvironment").invoke(null)
            : type.getConstructor(String.class).newInstance(key);
      } catch (NoSuchMethodException e) {
        try {
          made = type.getConstructor(Config.Scope.class).newInstance(config);
        } catch (NoSuchMethodException e2) {
          made = type.getConstructor().newInstance();
        }
      }
      LOG.infof("authpipe: CAPTCHA answers checked by %s", className);
      return (CaptchaVerifier) made;
    } catch (ClassNotFoundException e) {
      LOG.warnf("authpipe: no CAPTCHA verifier %s here; a demanded CAPTCHA is refused", className);
    } catch (java.lang.reflect.InvocationTargetException e) {
      LOG.errorf("authpipe: the CAPTCHA verifier %s refused its settings (%s); a demanded CAPTCHA "
          + "is refused", className, e.getCause() == null ? e.toString() : e.getCause().getMessage());
    } catch (ReflectiveOperationException | RuntimeException e) {
      LOG.errorf("authpipe: the CAPTCHA verifier %s could not be made (%s); a demanded CAPTCHA "
          + "is refused", className, e.toString());
    }
    return null;
  }

  /** A {@code public static fromEnvironment()} (the key from the environment when unset). */
  private static boolean hasFactory(Class<?> type) {
    try {
      return java.lang.reflect.Modifier.isStatic(type.getMethod("fromEnvironment").getModifiers());
    } catch (NoSuchMethodException e) {
      return false;
    }
  }

  @Override
  public String getId() {
    return ID;
  }

  @Override
  public String getDisplayType() {
    return "authpipe: edge check";
  }

  @Override
  public String getHelpText() {
    return "Asks the authpipe edge before the password: refuses (429), demands a CAPTCHA, or "
        + "notes a step-up. Place it after the username and before the password.";
  }

  @Override
  public List<ProviderConfigProperty> getConfigMetadata() {
    return EdgeSettings.serverProperties();
  }
}
