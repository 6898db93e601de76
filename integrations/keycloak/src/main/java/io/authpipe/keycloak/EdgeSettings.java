package io.authpipe.keycloak;

import java.util.List;
import java.util.Map;
import org.keycloak.Config;
import org.keycloak.models.AuthenticatorConfigModel;
import org.keycloak.provider.ProviderConfigProperty;
import org.keycloak.provider.ProviderConfigurationBuilder;

/**
 * Where the edge is and how long to wait for it: the server-wide defaults
 * ({@code spi-authenticator--authpipe-edge-check--<name>}), each of which an execution's
 * authenticator config (admin console: the gear of the execution) may override.
 */
record EdgeSettings(String url, String token, long timeoutMs, boolean failOpen,
    String captchaVerifier, int stepUpMaxAttempts) {

  static final String URL = "edge-url";
  static final String TOKEN = "edge-token";
  static final String TIMEOUT = "timeout-ms";
  static final String FAIL_OPEN = "fail-open";
  static final String CAPTCHA = "captcha-verifier";
  static final String STEP_UP_ATTEMPTS = "step-up-max-attempts";
  static final String DEFAULT_VERIFIER = "io.authpipe.keycloak.captcha.AltchaVerifier";

  static EdgeSettings from(Config.Scope c) {
    return new EdgeSettings(
        trim(c.get(URL, "http://127.0.0.1:8080")),
        c.get(TOKEN),
        c.getLong(TIMEOUT, 250L),
        c.getBoolean(FAIL_OPEN, true),
        c.get(CAPTCHA, DEFAULT_VERIFIER),
        c.getInt(STEP_UP_ATTEMPTS, 3));
  }

  /** These settings with an execution's config laid over them. */
  EdgeSettings with(AuthenticatorConfigModel model) {
    if (model == null || model.getConfig() == null) {
      return this;
    }
    Map<String, String> c = model.getConfig();
    return new EdgeSettings(
        blank(c.get(URL)) ? url : trim(c.get(URL)),
        blank(c.get(TOKEN)) ? token : c.get(TOKEN),
        blank(c.get(TIMEOUT)) ? timeoutMs : Long.parseLong(c.get(TIMEOUT).trim()),
        blank(c.get(FAIL_OPEN)) ? failOpen : Boolean.parseBoolean(c.get(FAIL_OPEN).trim()),
        captchaVerifier,
        blank(c.get(STEP_UP_ATTEMPTS)) ? stepUpMaxAttempts : Integer.parseInt(c.get(STEP_UP_ATTEMPTS).trim()));
  }

  private static boolean blank(String s) {
    return s == null || s.isBlank();
  }

  private static String trim(String url) {
    String u = url.trim();
    return u.endsWith("/") ? u.substring(0, u.length() - 1) : u;
  }

  /** The options an execution may override (shown in the admin console). */
  static List<ProviderConfigProperty> executionProperties() {
    return ProviderConfigurationBuilder.create()
        .property().name(URL).label("Edge URL").type(ProviderConfigProperty.STRING_TYPE)
        .helpText("the authpipe edge, e.g. http://127.0.0.1:8080 (default: the server's edge-url)").add()
        .property().name(TOKEN).label("Edge token").type(ProviderConfigProperty.PASSWORD)
        .helpText("bearer token of the edge (edge.token), if it has one").add()
        .property().name(TIMEOUT).label("Timeout (ms)").type(ProviderConfigProperty.STRING_TYPE)
        .helpText("how long a login waits for the edge (default 250)").add()
        .property().name(FAIL_OPEN).label("Fail open").type(ProviderConfigProperty.BOOLEAN_TYPE)
        .helpText("on: an unreachable edge lets the attempt be tried; off: it is refused").add()
        .property().name(STEP_UP_ATTEMPTS).label("Step-up attempts")
        .type(ProviderConfigProperty.STRING_TYPE)
        .helpText("wrong one-time codes allowed in one step-up before it is refused (default 3)").add()
        .build();
  }

  static List<ProviderConfigProperty> serverProperties() {
    return ProviderConfigurationBuilder.create()
        .property().name(URL).type("string").defaultValue("http://127.0.0.1:8080").helpText("the authpipe edge").add()
        .property().name(TOKEN).type("password").helpText("the edge's bearer token").add()
        .property().name(TIMEOUT).type("long").defaultValue(250L).helpText("edge timeout in ms").add()
        .property().name(FAIL_OPEN).type("boolean").defaultValue(true).helpText("fail open (true) or closed").add()
        .property().name(CAPTCHA).type("string").defaultValue(DEFAULT_VERIFIER)
        .helpText("class name of the io.authpipe.keycloak.captcha.CaptchaVerifier").add()
        .property().name("captcha-key").type("password")
        .helpText("the verifier's secret (ALTCHA: the HMAC key, at least 32 bytes, the same on every node)").add()
        .property().name(STEP_UP_ATTEMPTS).type("int").defaultValue(3).helpText("wrong codes per step-up").add()
        .build();
  }
}
