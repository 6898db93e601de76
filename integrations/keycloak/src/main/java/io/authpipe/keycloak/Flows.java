package io.authpipe.keycloak;

import jakarta.ws.rs.core.MediaType;
import jakarta.ws.rs.core.Response;
import java.util.LinkedHashMap;
import java.util.Map;
import org.keycloak.authentication.AuthenticationFlowContext;
import org.keycloak.authentication.AuthenticatorUtil;
import org.keycloak.authentication.authenticators.browser.AbstractUsernameFormAuthenticator;
import org.keycloak.models.UserModel;

/** What both authenticators ask of a flow: which kind it is, who is trying, how to answer. */
final class Flows {

  private Flows() {}

  /** The token endpoint's password grant (the direct-grant flow), not a browser page. */
  static boolean directGrant(AuthenticationFlowContext ctx) {
    var form = ctx.getHttpRequest().getDecodedFormParameters();
    return form != null && "password".equals(form.getFirst("grant_type"));
  }

  static String formValue(AuthenticationFlowContext ctx, String name) {
    var form = ctx.getHttpRequest().getDecodedFormParameters();
    return form == null ? null : form.getFirst(name);
  }

  /** The identifier as typed: the grant's {@code username}, the username page's, the user's. */
  static String account(AuthenticationFlowContext ctx) {
    if (directGrant(ctx)) {
      String typed = formValue(ctx, "username");
      if (typed != null && !typed.isBlank()) {
        return typed;
      }
    }
    String attempted =
        ctx.getAuthenticationSession().getAuthNote(AbstractUsernameFormAuthenticator.ATTEMPTED_USERNAME);
    if (attempted != null && !attempted.isBlank()) {
      return attempted;
    }
    UserModel user = ctx.getUser();
    return user == null ? null : user.getUsername();
  }

  /** {@code uia} when Keycloak forces a signed-in user to re-authenticate, else {@code login}. */
  static String flow(AuthenticationFlowContext ctx) {
    return AuthenticatorUtil.isForcedReauthentication(ctx.getAuthenticationSession()) ? "uia" : "login";
  }

  static String tenant(AuthenticationFlowContext ctx) {
    Settings s = AuthpipeEventListenerFactory.settings();
    String realm = ctx.getRealm().getName();
    return s == null ? "default" : s.tenantOf(realm);
  }

  static Attempts.Client client(AuthenticationFlowContext ctx) {
    Settings s = AuthpipeEventListenerFactory.settings();
    return Attempts.client(ctx.getSession(), s == null ? Settings.ADDRESS_CONNECTION : s.clientAddress())
        .trustFor(ctx.getUser());
  }

  static void report(AuthenticationFlowContext ctx, String flow, String account, String outcome,
      String reason, String challenge) {
    AuthpipeEventListenerFactory.report(ctx.getSession(), ctx.getRealm(), flow, account, outcome,
        reason, challenge);
  }

  /** Whole seconds for Retry-After, at least 1. */
  static long retryAfterSeconds(long retryAfterMs) {
    return Math.max(1, (retryAfterMs + 999) / 1000);
  }

  /** A token-endpoint error in OAuth's JSON shape. */
  static Response json(int status, String error, String description, Long retryAfterMs) {
    return json(status, error, description, retryAfterMs, Map.of());
  }

  /** The same with {@code extra} fields in the body. */
  static Response json(int status, String error, String description, Long retryAfterMs,
      Map<String, Object> extra) {
    Map<String, Object> body = new LinkedHashMap<>();
    body.put("error", error);
    body.put("error_description", description);
    if (retryAfterMs != null) {
      body.put("retry_after_ms", retryAfterMs);
    }
    body.putAll(extra);
    Response.ResponseBuilder r = Response.status(status).type(MediaType.APPLICATION_JSON_TYPE)
        .entity(Attempts.json(body)).header("Cache-Control", "no-store");
    if (retryAfterMs != null) {
      r.header("Retry-After", Long.toString(retryAfterSeconds(retryAfterMs)));
    }
    return r.build();
  }

  /** A browser error page with {@code status} (a message, no form to go on with). */
  static Response page(AuthenticationFlowContext ctx, Response.Status status, String message,
      Long retryAfterMs) {
    Response page = ctx.form().setError(message).createErrorPage(status);
    if (retryAfterMs == null) {
      return page;
    }
    return Response.fromResponse(page)
        .header("Retry-After", Long.toString(retryAfterSeconds(retryAfterMs))).build();
  }
}
