package io.authpipe.keycloak;

import jakarta.ws.rs.core.Response;
import java.util.Map;
import org.keycloak.authentication.AuthenticationFlowContext;

/**
 * The step-up by an e-mailed code ({@link MailedCode}) for a user with a verified address and no
 * second factor, reported as the OTP path is: the right password as {@code step_up} (by {@link
 * StepUpAuthenticator}), each code as {@code flow = "mfa"} ({@code bad_second_factor} when
 * wrong, after the edge was asked with {@code mfa}), the sign-in with {@code challenge =
 * "step_up"}. A wrong code never reaches Keycloak's brute-force detection. After {@value
 * MailedCode#MAX_TRIES} wrong codes the code is void and the step-up fails: the browser's
 * attempt is refused (start again), the grant answers 403 and mails a new code only when asked
 * again without one.
 */
final class StepUpByMail {

  private StepUpByMail() {}

  /** Browser: mail a code unless one is pending in this authentication, then ask for it. */
  static void ask(AuthenticationFlowContext ctx) {
    MailedCode.Store store = MailedCode.browser(ctx.getAuthenticationSession());
    if (!MailedCode.pending(store, System.currentTimeMillis())
        && !MailedCode.send(ctx.getSession(), ctx.getRealm(), ctx.getUser(), store)) {
      ctx.challenge(Flows.page(ctx, Response.Status.SERVICE_UNAVAILABLE,
          "The sign-in code could not be sent. Please try again later.", null));
      return;
    }
    ctx.challenge(form(ctx, null));
  }

  /** Browser: the code page was posted. */
  static void action(AuthenticationFlowContext ctx, String account) {
    String code = StepUpAuthenticator.code(ctx);
    if (code == null || code.isBlank()) {
      ctx.challenge(form(ctx, "Please enter the code from the e-mail."));
      return;
    }
    EdgeSettings edge = EdgeCheckAuthenticatorFactory.defaults().with(ctx.getAuthenticatorConfig());
    if (!StepUpAuthenticator.edgeAllowsCode(ctx, edge, account)) {
      return;
    }
    MailedCode.Check result = MailedCode.check(
        MailedCode.browser(ctx.getAuthenticationSession()), code, System.currentTimeMillis());
    report(ctx, account, result);
    switch (result) {
      case RIGHT -> {
        StepUpAuthenticator.steppedUp(ctx);
        ctx.success();
      }
      case WRONG -> ctx.challenge(form(ctx, "Invalid code."));
      default -> {
        ctx.getAuthenticationSession().setAuthNote(StepUpAuthenticator.NOTE_METHOD, "refused");
        StepUpAuthenticator.refused(ctx);
      }
    }
  }

  /**
   * Direct grant: without {@code otp} a new code is mailed (401 {@code step_up_required},
   * {@code step_up_method = "email"}); with it the pending code is checked.
   */
  static void grant(AuthenticationFlowContext ctx, String account) {
    MailedCode.Store store = MailedCode.grant(ctx.getSession(), ctx.getRealm(), ctx.getUser());
    String code = StepUpAuthenticator.code(ctx);
    if (code == null) {
      if (!MailedCode.send(ctx.getSession(), ctx.getRealm(), ctx.getUser(), store)) {
        ctx.challenge(Flows.json(503, "temporarily_unavailable",
            "the sign-in code could not be mailed; retry later", null));
        return;
      }
      ctx.challenge(Flows.json(401, "step_up_required",
          "this sign-in needs the code just mailed to the account's address: send it as 'otp'",
          null, Map.of("step_up_method", "email")));
      return;
    }
    EdgeSettings edge = EdgeCheckAuthenticatorFactory.defaults().with(ctx.getAuthenticatorConfig());
    if (!StepUpAuthenticator.edgeAllowsCode(ctx, edge, account)) {
      return;
    }
    MailedCode.Check result = MailedCode.check(store, code, System.currentTimeMillis());
    report(ctx, account, result);
    switch (result) {
      case RIGHT -> {
        StepUpAuthenticator.steppedUp(ctx);
        ctx.success();
      }
      case WRONG -> ctx.challenge(Flows.json(401, "invalid_grant", "invalid code", null));
      case USED_UP -> ctx.challenge(Flows.json(403, "access_denied",
          "too many wrong codes: the code is void; ask for a new one (the request without 'otp')",
          null));
      default -> ctx.challenge(Flows.json(401, "invalid_grant",
          "no code is pending (expired or used): ask for one (the request without 'otp')", null));
    }
  }

  private static void report(AuthenticationFlowContext ctx, String account, MailedCode.Check r) {
    boolean right = r == MailedCode.Check.RIGHT;
    Flows.report(ctx, "mfa", account, right ? "success" : "failure",
        right ? null : "bad_second_factor", null);
  }

  /** Keycloak's own code page (field {@code otp}), saying where the code went. */
  private static Response form(AuthenticationFlowContext ctx, String error) {
    var form = ctx.form().setInfo("A " + MailedCode.DIGITS + "-digit code was sent to "
        + MailedCode.masked(ctx.getUser().getEmail()) + ". It is valid for "
        + MailedCode.TTL_MS / 60_000 + " minutes.");
    if (error != null) {
      form.setError(error);
    }
    return form.createLoginTotp();
  }
}
