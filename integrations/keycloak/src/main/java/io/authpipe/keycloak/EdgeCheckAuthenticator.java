package io.authpipe.keycloak;

import io.authpipe.keycloak.captcha.CaptchaVerifier;
import jakarta.ws.rs.core.NewCookie;
import jakarta.ws.rs.core.Response;
import java.net.URL;
import org.jboss.logging.Logger;
import org.keycloak.authentication.AuthenticationFlowContext;
import org.keycloak.authentication.Authenticator;
import org.keycloak.models.KeycloakSession;
import org.keycloak.models.RealmModel;
import org.keycloak.models.UserModel;
import org.keycloak.theme.Theme;

/**
 * Asks the authpipe edge whether this attempt may be tried, before the password is looked at.
 *
 * <p>Place it first in a copy of the direct-grant flow, and in a copy of the browser flow after
 * the username page (Username Form) and before the password page (Password Form). It honours the
 * answer as the reference login service does:
 *
 * <ul>
 *   <li>{@code allowed = false}: the attempt is refused without a password check and reported
 *       ({@code failure_reason = "refused"}); the token endpoint answers HTTP 429 with {@code
 *       Retry-After} (seconds) and {@code retry_after_ms}, the browser an error page with the same
 *       status and header. Keycloak's own brute-force counter is not touched;
 *   <li>{@code challenge = "captcha"}: the client must answer a CAPTCHA first (the login theme's
 *       {@code authpipe-captcha.ftl} page, or the grant's {@code authpipe-captcha} parameter),
 *       checked by the configured {@link CaptchaVerifier} and reported as {@code flow =
 *       "challenge"}; a failed one ends the attempt before the password;
 *   <li>{@code step_up}: noted for the step-up authenticator ({@code authpipe-step-up}), which
 *       runs after the password.
 * </ul>
 *
 * An unreachable edge (past {@code timeout-ms}) fails open or closed per {@code fail-open}.
 */
final class EdgeCheckAuthenticator implements Authenticator {

  static final String CAPTCHA_FIELD = "authpipe-captcha";
  static final String CAPTCHA_TEMPLATE = "authpipe-captcha.ftl";
  private static final String NOTE_CAPTCHA = "authpipe.captcha";
  private static final Logger LOG = Logger.getLogger(EdgeCheckAuthenticator.class);
  private static final long DEVICE_COOKIE_MAX_AGE_S = 400L * 24 * 3600;

  private final EdgeSettings defaults;
  private final CaptchaVerifier verifier;

  EdgeCheckAuthenticator(EdgeSettings defaults, CaptchaVerifier verifier) {
    this.defaults = defaults;
    this.verifier = verifier;
  }

  @Override
  public void authenticate(AuthenticationFlowContext ctx) {
    String account = Flows.account(ctx);
    if (account == null || account.isBlank()) {
      ctx.success(); // no identifier: Keycloak's own next step refuses it
      return;
    }
    boolean grant = Flows.directGrant(ctx);
    if (!grant) {
      ensureDevice(ctx);
    }
    String flow = Flows.flow(ctx);
    EdgeSettings edge = defaults.with(ctx.getAuthenticatorConfig());
    EdgeClient.Answer answer =
        EdgeClient.check(edge, Flows.tenant(ctx), account, Flows.client(ctx), flow);
    if (answer.stepUp()) {
      ctx.getAuthenticationSession().setAuthNote(Attempts.NOTE_STEP_UP, "true");
    } else {
      ctx.getAuthenticationSession().removeAuthNote(Attempts.NOTE_STEP_UP);
    }
    if (!answer.allowed()) {
      Flows.report(ctx, flow, account, "failure", "refused", null);
      long retryMs = answer.retryAfterMs();
      ctx.challenge(grant
          ? Flows.json(429, "too_many_requests", "too many sign-in attempts; retry later", retryMs)
          : Flows.page(ctx, Response.Status.TOO_MANY_REQUESTS,
              "Too many sign-in attempts. Please try again in " + Flows.retryAfterSeconds(retryMs)
                  + " seconds.", retryMs));
      return;
    }
    if ("captcha".equals(answer.challenge())) {
      if (grant) {
        String payload = Flows.formValue(ctx, CAPTCHA_FIELD);
        if (payload == null) {
          ctx.challenge(Flows.json(401, "captcha_required",
              "answer the CAPTCHA and send it as '" + CAPTCHA_FIELD + "'", null,
              challengeField(verifier)));
          return;
        }
        if (!captcha(ctx, flow, account, payload)) {
          ctx.challenge(Flows.json(401, "invalid_grant", "the CAPTCHA answer was not accepted", null));
          return;
        }
      } else {
        ctx.getAuthenticationSession().setAuthNote(NOTE_CAPTCHA, "pending");
        ctx.challenge(captchaPage(ctx, null));
        return;
      }
    }
    ctx.success();
  }

  @Override
  public void action(AuthenticationFlowContext ctx) {
    // Only the CAPTCHA page posts back to this execution.
    if (!"pending".equals(ctx.getAuthenticationSession().getAuthNote(NOTE_CAPTCHA))) {
      authenticate(ctx);
      return;
    }
    String account = Flows.account(ctx);
    String flow = Flows.flow(ctx);
    String payload = Flows.formValue(ctx, CAPTCHA_FIELD);
    if (account == null || payload == null) {
      ctx.challenge(captchaPage(ctx, "Please answer the CAPTCHA."));
      return;
    }
    if (!captcha(ctx, flow, account, payload)) {
      ctx.challenge(captchaPage(ctx, "The CAPTCHA answer was not accepted. Please try again."));
      return;
    }
    ctx.getAuthenticationSession().removeAuthNote(NOTE_CAPTCHA);
    ctx.success();
  }

  /** Verify and report one answer ({@code flow = "challenge"}, {@code challenge = "captcha"}). */
  private boolean captcha(AuthenticationFlowContext ctx, String flow, String account, String payload) {
    boolean passed;
    if (verifier == null) {
      LOG.warn("authpipe: the edge asked for a CAPTCHA and no CaptchaVerifier is installed; "
          + "the answer is refused");
      passed = false;
    } else {
      try {
        passed = verifier.verify(payload);
      } catch (RuntimeException e) {
        LOG.warnf("authpipe: the CAPTCHA verifier failed (%s); the answer is refused", e.toString());
        passed = false;
      }
    }
    Flows.report(ctx, "challenge", account, passed ? "success" : "failure",
        passed ? null : "other", "captcha");
    return passed;
  }

  private Response captchaPage(AuthenticationFlowContext ctx, String error) {
    if (!hasTemplate(ctx.getSession()) || verifier == null) {
      LOG.warn("authpipe: the edge asked for a CAPTCHA and the login theme has no "
          + CAPTCHA_TEMPLATE + " or no CaptchaVerifier is installed; the attempt is refused");
      return Flows.page(ctx, Response.Status.TOO_MANY_REQUESTS,
          "Sign-in is paused for this account. Please try again later.", 60_000L);
    }
    var form = ctx.form().setAttribute("authpipeCaptchaField", CAPTCHA_FIELD);
    String challenge = challengeOf(verifier);
    if (challenge != null) {
      form.setAttribute("altchaChallenge", challenge);
    }
    if (error != null) {
      form.setError(error);
    }
    return form.createForm(CAPTCHA_TEMPLATE);
  }

  /** {@code captcha_challenge}: a fresh challenge as JSON, for a client of the grant. */
  private static java.util.Map<String, Object> challengeField(CaptchaVerifier verifier) {
    String challenge = challengeOf(verifier);
    if (challenge == null) {
      return java.util.Map.of();
    }
    try {
      return java.util.Map.of("captcha_challenge", Attempts.mapper().readTree(challenge));
    } catch (Exception e) {
      return java.util.Map.of();
    }
  }

  /** A fresh challenge from a verifier that issues them ({@code String newChallengeJson()}). */
  private static String challengeOf(CaptchaVerifier verifier) {
    if (verifier == null) {
      return null;
    }
    try {
      Object made = verifier.getClass().getMethod("newChallengeJson").invoke(verifier);
      return made instanceof String text ? text : null;
    } catch (ReflectiveOperationException | RuntimeException e) {
      return null;
    }
  }

  private static boolean hasTemplate(KeycloakSession session) {
    try {
      Theme theme = session.theme().getTheme(Theme.Type.LOGIN);
      URL url = theme.getTemplate(CAPTCHA_TEMPLATE);
      return url != null;
    } catch (Exception e) {
      return false;
    }
  }

  /** The browser's device cookie: an opaque id, set once (400 days), HttpOnly. */
  private static void ensureDevice(AuthenticationFlowContext ctx) {
    var cookies = ctx.getHttpRequest().getHttpHeaders().getCookies();
    var existing = cookies.get(Attempts.DEVICE_COOKIE);
    if (existing != null && Attempts.validDevice(existing.getValue())) {
      return;
    }
    if (ctx.getAuthenticationSession().getAuthNote(Attempts.NOTE_DEVICE) != null) {
      return;
    }
    String id = Attempts.newDeviceId();
    ctx.getAuthenticationSession().setAuthNote(Attempts.NOTE_DEVICE, id);
    boolean secure = "https".equalsIgnoreCase(ctx.getUriInfo().getBaseUri().getScheme());
    try {
      ctx.getSession().getContext().getHttpResponse().setCookieIfAbsent(
          new NewCookie.Builder(Attempts.DEVICE_COOKIE).value(id)
              .path("/realms/" + ctx.getRealm().getName() + "/")
              .maxAge((int) DEVICE_COOKIE_MAX_AGE_S).secure(secure).httpOnly(true)
              .sameSite(NewCookie.SameSite.LAX).build());
    } catch (RuntimeException e) {
      LOG.debugf("authpipe: the device cookie was not set: %s", e.toString());
    }
  }

  @Override
  public boolean requiresUser() {
    return false;
  }

  @Override
  public boolean configuredFor(KeycloakSession session, RealmModel realm, UserModel user) {
    return true;
  }

  @Override
  public void setRequiredActions(KeycloakSession session, RealmModel realm, UserModel user) {}

  @Override
  public void close() {}
}
