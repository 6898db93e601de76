package io.authpipe.keycloak.captcha;

/**
 * The server-side check of a CAPTCHA answer the edge demanded ({@code challenge = "captcha"}).
 *
 * <p>The authenticator ({@code io.authpipe.keycloak.EdgeCheckAuthenticator}) asks the client for
 * a CAPTCHA before the password is looked at, then passes the answer the login page posted (the
 * form field {@code authpipe-captcha}; for the direct grant, the request parameter of the same
 * name) to {@link #verify}. Its result is reported as a {@code login_attempt} event with {@code
 * flow = "challenge"}, {@code challenge = "captcha"}; a failed answer ends the attempt before the
 * password is checked.
 *
 * <p>Implementations must be thread-safe (one instance serves every login), must not block for
 * long (a login waits on them), and must never throw for bad input: a malformed, replayed or
 * expired payload is simply {@code false}.
 */
public interface CaptchaVerifier {

  /**
   * True when {@code payload} (the client's answer as posted, possibly null or empty) is a valid,
   * unused solution of a challenge this server issued.
   */
  boolean verify(String payload);
}
