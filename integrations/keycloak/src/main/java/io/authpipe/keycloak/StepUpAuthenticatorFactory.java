package io.authpipe.keycloak;

import java.util.List;
import org.keycloak.Config;
import org.keycloak.authentication.Authenticator;
import org.keycloak.authentication.AuthenticatorFactory;
import org.keycloak.models.AuthenticationExecutionModel;
import org.keycloak.models.KeycloakSession;
import org.keycloak.models.KeycloakSessionFactory;
import org.keycloak.provider.ProviderConfigProperty;

/** {@code authpipe-step-up}: see {@link StepUpAuthenticator}; the edge settings are the check's. */
public final class StepUpAuthenticatorFactory implements AuthenticatorFactory {

  public static final String ID = "authpipe-step-up";
  private static final StepUpAuthenticator SINGLETON = new StepUpAuthenticator();

  @Override
  public Authenticator create(KeycloakSession session) {
    return SINGLETON;
  }

  @Override
  public void init(Config.Scope config) {}

  @Override
  public void postInit(KeycloakSessionFactory factory) {}

  @Override
  public void close() {}

  @Override
  public String getId() {
    return ID;
  }

  @Override
  public String getDisplayType() {
    return "authpipe: step-up";
  }

  @Override
  public String getReferenceCategory() {
    return "authpipe";
  }

  @Override
  public boolean isConfigurable() {
    return true;
  }

  @Override
  public AuthenticationExecutionModel.Requirement[] getRequirementChoices() {
    return new AuthenticationExecutionModel.Requirement[] {
      AuthenticationExecutionModel.Requirement.REQUIRED,
      AuthenticationExecutionModel.Requirement.DISABLED
    };
  }

  @Override
  public boolean isUserSetupAllowed() {
    return false;
  }

  @Override
  public String getHelpText() {
    return "After the password: when the authpipe edge asked for a step-up, demands the user's "
        + "one-time code or security key; refuses users who have none (no enrolment).";
  }

  @Override
  public List<ProviderConfigProperty> getConfigProperties() {
    return EdgeSettings.executionProperties();
  }
}
