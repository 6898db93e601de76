package io.authpipe.keycloak;

import jakarta.ws.rs.core.Response;
import org.keycloak.authentication.AuthenticationFlowContext;
import org.keycloak.authentication.AuthenticationProcessor;
import org.keycloak.authentication.Authenticator;
import org.keycloak.authentication.AuthenticatorFactory;
import org.keycloak.models.KeycloakSession;
import org.keycloak.models.RealmModel;
import org.keycloak.models.UserCredentialModel;
import org.keycloak.models.UserModel;
import org.keycloak.models.credential.OTPCredentialModel;
import org.keycloak.models.credential.WebAuthnCredentialModel;
import org.keycloak.sessions.AuthenticationSessionModel;

/**
 * The step-up the edge asked for ({@code step_up}), after a right password: place it right after
 * the password step (Password Form, or Password in the direct grant).
 *
 * <p>When the edge's check before the password said {@code step_up}, the right password is
 * reported as {@code outcome = "step_up"} (not a sign-in), then the user must pass a second
 * factor they already have: a one-time code (OTP), or in the browser a security key (WebAuthn,
 * Keycloak's own authenticator run in its place); a user with neither but a verified e-mail
 * address is mailed a one-time code ({@link StepUpByMail}). Each code is checked after asking the edge with
 * {@code flow = "mfa"} and reported as a {@code flow = "mfa"} event ({@code bad_second_factor}
 * when wrong); wrong codes never count in Keycloak's brute-force detection; after {@code
 * step-up-max-attempts} wrong codes the attempt is refused. The completed sign-in (Keycloak's
 * {@code LOGIN}) is then reported with {@code challenge = "step_up"}.
 *
 * <p>A user with no second factor and no verified address gets a clean refusal (HTTP 403, an error page or OAuth's {@code
 * access_denied}): never a 500, and never a required action that would let whoever holds the
 * password enrol a factor of their own. This authenticator is always "configured" so Keycloak
 * never offers a set-up either.
 */
final class StepUpAuthenticator implements Authenticator {

  static final String WEBAUTHN_ID = "webauthn-authenticator";
  static final String NOTE_METHOD = "authpipe.step_up_method";
  private static final String NOTE_REPORTED = "authpipe.step_up_reported";
  private static final String NOTE_FAILURES = "authpipe.step_up_failures";

  @Override
  public void authenticate(AuthenticationFlowContext ctx) {
    AuthenticationSessionModel auth = ctx.getAuthenticationSession();
    UserModel user = ctx.getUser();
    if (!"true".equals(auth.getAuthNote(Attempts.NOTE_STEP_UP)) || user == null
        || Flows.client(ctx).deviceTrusted()) {
      ctx.success(); // no step-up asked, or the owner's trusted device (one passed there before)
      return;
    }
    if ("refused".equals(auth.getAuthNote(NOTE_METHOD))) {
      refused(ctx); // this step-up failed: no new form, no new code until the sign-in restarts
      return;
    }
    String account = Flows.account(ctx);
    if (auth.getAuthNote(NOTE_REPORTED) == null) {
      Flows.report(ctx, Flows.flow(ctx), account, "step_up", null, null);
      auth.setAuthNote(NOTE_REPORTED, "true");
    }
    boolean otp = user.credentialManager().isConfiguredFor(OTPCredentialModel.TYPE);
    boolean webauthn = user.credentialManager().isConfiguredFor(WebAuthnCredentialModel.TYPE_TWOFACTOR);
    boolean mail = !otp && !webauthn && MailedCode.available(ctx.getRealm(), user);
    if (Flows.directGrant(ctx)) {
      if (!otp && MailedCode.available(ctx.getRealm(), user)) {
        StepUpByMail.grant(ctx, account);
        return;
      }
      if (!otp) {
        ctx.challenge(Flows.json(403, "access_denied",
            "this sign-in needs a second factor and the account has none usable here", null));
        return;
      }
      String code = code(ctx);
      if (code == null) {
        ctx.challenge(Flows.json(401, "step_up_required",
            "this sign-in needs the account's one-time code: send it as 'otp'", null));
        return;
      }
      checkCode(ctx, account, code);
      return;
    }
    if (otp) {
      auth.setAuthNote(NOTE_METHOD, "otp");
      ctx.challenge(ctx.form().createLoginTotp());
    } else if (webauthn) {
      auth.setAuthNote(NOTE_METHOD, "webauthn");
      webAuthn(ctx).authenticate(ctx);
    } else if (mail) {
      auth.setAuthNote(NOTE_METHOD, "email");
      StepUpByMail.ask(ctx);
    } else {
      ctx.challenge(Flows.page(ctx, Response.Status.FORBIDDEN,
          "This sign-in needs a second factor, and none is set up on this account. "
              + "Please contact your administrator.", null));
    }
  }

  @Override
  public void action(AuthenticationFlowContext ctx) {
    String method = ctx.getAuthenticationSession().getAuthNote(NOTE_METHOD);
    String account = Flows.account(ctx);
    if ("webauthn".equals(method)) {
      webAuthn(ctx).action(ctx);
      var status = ((AuthenticationProcessor.Result) ctx).getStatus();
      if (status == null) {
        return;
      }
      switch (status) {
        case SUCCESS -> {
          Flows.report(ctx, "mfa", account, "success", null, null);
          steppedUp(ctx);
        }
        case FAILED, FAILURE_CHALLENGE ->
            Flows.report(ctx, "mfa", account, "failure", "bad_second_factor", null);
        default -> { }
      }
      return;
    }
    if ("refused".equals(method)) {
      refused(ctx);
      return;
    }
    if ("email".equals(method)) {
      StepUpByMail.action(ctx, account);
      return;
    }
    if (!"otp".equals(method)) {
      authenticate(ctx);
      return;
    }
    String code = code(ctx);
    if (code == null || code.isBlank()) {
      ctx.challenge(ctx.form().setError("Please enter the one-time code.").createLoginTotp());
      return;
    }
    checkCode(ctx, account, code);
  }

  /** Ask the edge ({@code mfa}), check the code once, report it; succeed or answer again. */
  private void checkCode(AuthenticationFlowContext ctx, String account, String code) {
    boolean grant = Flows.directGrant(ctx);
    EdgeSettings edge = EdgeCheckAuthenticatorFactory.defaults().with(ctx.getAuthenticatorConfig());
    if (!edgeAllowsCode(ctx, edge, account)) {
      return;
    }
    UserModel user = ctx.getUser();
    String credentialId = ctx.getHttpRequest().getDecodedFormParameters().getFirst("selectedCredentialId");
    if (credentialId == null || credentialId.isBlank()) {
      credentialId = user.credentialManager().getStoredCredentialsByTypeStream(OTPCredentialModel.TYPE)
          .findFirst().map(c -> c.getId()).orElse(null);
    }
    boolean valid = credentialId != null && user.credentialManager()
        .isValid(new UserCredentialModel(credentialId, OTPCredentialModel.TYPE, code));
    Flows.report(ctx, "mfa", account, valid ? "success" : "failure",
        valid ? null : "bad_second_factor", null);
    if (valid) {
      steppedUp(ctx);
      ctx.success();
      return;
    }
    AuthenticationSessionModel auth = ctx.getAuthenticationSession();
    int failures = parse(auth.getAuthNote(NOTE_FAILURES)) + 1;
    auth.setAuthNote(NOTE_FAILURES, Integer.toString(failures));
    if (grant) {
      ctx.challenge(Flows.json(401, "invalid_grant", "invalid one-time code", null));
    } else if (failures >= edge.stepUpMaxAttempts()) {
      auth.setAuthNote(NOTE_METHOD, "refused");
      refused(ctx);
    } else {
      ctx.challenge(ctx.form().setError("Invalid one-time code.").createLoginTotp());
    }
  }

  /** The browser's step-up failed (too many wrong codes): a 403 page, whatever is posted. */
  static void refused(AuthenticationFlowContext ctx) {
    ctx.challenge(Flows.page(ctx, Response.Status.FORBIDDEN,
        "Too many wrong codes, or the code expired. Please start the sign-in again.", null));
  }

  /** Ask the edge ({@code mfa}) before a code is checked; refused: reported and answered. */
  static boolean edgeAllowsCode(AuthenticationFlowContext ctx, EdgeSettings edge, String account) {
    EdgeClient.Answer answer =
        EdgeClient.check(edge, Flows.tenant(ctx), account, Flows.client(ctx), "mfa");
    if (answer.allowed()) {
      return true;
    }
    Flows.report(ctx, "mfa", account, "failure", "refused", null);
    long retryMs = answer.retryAfterMs();
    ctx.challenge(Flows.directGrant(ctx)
        ? Flows.json(429, "too_many_requests", "too many attempts; retry later", retryMs)
        : Flows.page(ctx, Response.Status.TOO_MANY_REQUESTS,
            "Too many attempts. Please try again later.", retryMs));
    return false;
  }

  static void steppedUp(AuthenticationFlowContext ctx) {
    Attempts.Client client = Flows.client(ctx);
    if (client.fromCookie()) {
      Attempts.trust(ctx.getUser(), client); // possession proven on this browser: trusted
    }
    ctx.getAuthenticationSession().setAuthNote(Attempts.NOTE_STEPPED_UP, "true");
    ctx.getEvent().detail(Attempts.DETAIL_CHALLENGE, "step_up");
  }

  static String code(AuthenticationFlowContext ctx) {
    String otp = Flows.formValue(ctx, "otp");
    return otp != null ? otp : Flows.formValue(ctx, "totp");
  }

  static int parse(String text) {
    try {
      return text == null ? 0 : Integer.parseInt(text);
    } catch (NumberFormatException e) {
      return 0;
    }
  }

  private static Authenticator webAuthn(AuthenticationFlowContext ctx) {
    KeycloakSession session = ctx.getSession();
    var factory = (AuthenticatorFactory) session.getKeycloakSessionFactory()
        .getProviderFactory(Authenticator.class, WEBAUTHN_ID);
    return factory.create(session);
  }

  @Override
  public boolean requiresUser() {
    return true;
  }

  @Override
  public boolean configuredFor(KeycloakSession session, RealmModel realm, UserModel user) {
    return true; // never "set up": a user without a factor is refused, never asked to enrol
  }

  @Override
  public void setRequiredActions(KeycloakSession session, RealmModel realm, UserModel user) {}

  @Override
  public void close() {}
}
