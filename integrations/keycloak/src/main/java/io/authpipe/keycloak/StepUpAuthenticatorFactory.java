package io.authpipe.keycloak;

import org.keycloak.Config;
import org.keycloak.authentication.Authenticator;
import org.keycloak.models.KeycloakSession;

/** {@code authpipe-step-up}: see {@link StepUpAuthenticator}; the edge settings are the check's. */
public final class StepUpAuthenticatorFactory extends AuthpipeAuthenticatorFactory {

  public static final String ID = "authpipe-step-up";
  private static final StepUpAuthenticator SINGLETON = new StepUpAuthenticator();

  @Override
  public Authenticator create(KeycloakSession session) {
    return SINGLETON;
  }

  @Override
  public void init(Config.Scope config) {}

  @Override
  public String getId() {
    return ID;
  }

  @Override
  public String getDisplayType() {
    return "authpipe: step-up";
  }

  @Override
  public String getHelpText() {
    return "After the password: when the authpipe edge asked for a step-up, demands the user's "
        + "one-time code or security key, or mails a code to a verified address; refuses users "
        + "who have none of these (no enrolment).";
  }
}
