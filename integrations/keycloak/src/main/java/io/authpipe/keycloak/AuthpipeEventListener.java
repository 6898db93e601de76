package io.authpipe.keycloak;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.util.Base64;
import java.util.Map;
import org.jboss.logging.Logger;
import org.keycloak.authentication.AuthenticatorUtil;
import org.keycloak.events.Details;
import org.keycloak.events.Errors;
import org.keycloak.events.Event;
import org.keycloak.events.EventListenerProvider;
import org.keycloak.events.EventType;
import org.keycloak.events.admin.AdminEvent;
import org.keycloak.models.Constants;
import org.keycloak.models.KeycloakSession;
import org.keycloak.models.RealmModel;
import org.keycloak.models.UserModel;
import org.keycloak.sessions.AuthenticationSessionModel;

/**
 * Keycloak's events as {@code login_attempt} v1 records, one per door a secret is tried at:
 *
 * <ul>
 *   <li>{@code LOGIN}: the completed sign-in, {@code success} ({@code flow = "uia"} when Keycloak
 *       forced a re-authentication of a signed-in user; {@code challenge = "step_up"} when the
 *       authpipe step-up passed on the way);
 *   <li>{@code LOGIN_ERROR}: {@code user_not_found} is {@code unknown_account} (the typed name is
 *       the account), {@code invalid_user_credentials} is {@code bad_password}, or, from a
 *       one-time-code form ({@code selected_credential_id} set), {@code flow = "mfa"} with
 *       {@code bad_second_factor}; a locked or disabled user is {@code refused}; other errors (an
 *       expired page, a bad redirect) try no secret and are not published;
 *   <li>a reset completed through Keycloak's mailed link ({@link #endsResetLink}: the {@code
 *       LOGIN} that ends it; or {@code RESET_PASSWORD}, which 26.5.6 does not send): {@code flow =
 *       "reset"}, {@code success};
 *   <li>a reset link that failed ({@link #failedResetLink}): {@code flow = "reset"}, {@code
 *       failure}, {@code other} ({@code refused} for a disabled user).
 * </ul>
 *
 * The edge's refusals, CAPTCHAs and step-ups are reported by the authenticators themselves
 * (Keycloak sends no event for them). Nothing here blocks or throws into Keycloak.
 */
public final class AuthpipeEventListener implements EventListenerProvider {

  private static final Logger LOG = Logger.getLogger(AuthpipeEventListener.class);
  /** The action of Keycloak's reset-password link ({@code ResetCredentialsActionToken}). */
  static final String RESET_ACTION = "reset-credentials";

  private final KeycloakSession session;

  AuthpipeEventListener(KeycloakSession session) {
    this.session = session;
  }

  @Override
  public void onEvent(Event event) {
    try {
      Settings settings = AuthpipeEventListenerFactory.settings();
      if (settings != null) {
        handle(event, settings);
      }
    } catch (RuntimeException e) {
      LOG.warnf("authpipe: event %s not published: %s", event.getType(), e.toString());
    }
  }

  private void handle(Event event, Settings settings) {
    EventType type = event.getType();
    Map<String, String> details = event.getDetails() == null ? Map.of() : event.getDetails();
    AuthenticationSessionModel auth = session.getContext().getAuthenticationSession();
    boolean reauth = auth != null && AuthenticatorUtil.isForcedReauthentication(auth);
    String flow = reauth ? "uia" : "login";
    String outcome;
    String reason = null;
    String challenge = null;
    if (type == EventType.LOGIN && endsResetLink(auth)) {
      flow = "reset"; // Keycloak 26.5.6 sends no RESET_PASSWORD: the reset ends in this LOGIN
      outcome = "success";
    } else if (type == EventType.LOGIN) {
      outcome = "success";
      boolean steppedUp = "step_up".equals(details.get(Attempts.DETAIL_CHALLENGE))
          || (auth != null && "true".equals(auth.getAuthNote(Attempts.NOTE_STEPPED_UP)));
      challenge = steppedUp ? "step_up" : null;
    } else if (type == EventType.LOGIN_ERROR) {
      outcome = "failure";
      String error = event.getError() == null ? "" : event.getError();
      switch (error) {
        case Errors.USER_NOT_FOUND -> reason = "unknown_account";
        case Errors.INVALID_USER_CREDENTIALS -> {
          if (details.containsKey(Details.SELECTED_CREDENTIAL_ID)) {
            flow = "mfa";
            reason = "bad_second_factor";
          } else {
            reason = "bad_password";
          }
        }
        case Errors.USER_TEMPORARILY_DISABLED, Errors.USER_DISABLED -> reason = "refused";
        default -> {
          return;
        }
      }
    } else if (type == EventType.RESET_PASSWORD) {
      flow = "reset";
      outcome = "success";
    } else if (failedResetLink(type, details)) {
      flow = "reset";
      outcome = "failure";
      String error = event.getError() == null ? "" : event.getError();
      switch (error) {
        case Errors.USER_TEMPORARILY_DISABLED, Errors.USER_DISABLED -> reason = "refused";
        case Errors.REALM_DISABLED, Errors.SSL_REQUIRED -> {
          return; // the server refused before the link was looked at
        }
        default -> reason = "other";
      }
    } else {
      return;
    }
    String account = accountOf(event, details);
    if (account == null) {
      return;
    }
    RealmModel realm = session.realms().getRealm(event.getRealmId());
    String tenant = settings.tenantOf(realm == null ? null : realm.getName());
    String sessionId = "uia".equals(flow) ? event.getSessionId() : null;
    Attempts.Client client = Attempts.client(session, settings.clientAddress());
    if (event.getIpAddress() != null && Settings.ADDRESS_KEYCLOAK.equals(settings.clientAddress())) {
      client = client.withPeer(event.getIpAddress());
    }
    // The sign-in that completed a step-up is reported as the attempt was: untrusted (its
    // device is trusted from the next sign-in on, as the reference login service reports it).
    if (realm != null && event.getUserId() != null && challenge == null) {
      client = client.trustFor(session.users().getUserById(realm, event.getUserId()));
    }
    AuthpipeEventListenerFactory.publish(Attempts.record(event.getId(), event.getTime(), tenant,
        settings.service(), flow, account, client, outcome, reason, challenge, sessionId));
  }

  /**
   * A reset link tried at Keycloak's action-token endpoint and refused. Keycloak 26.5.6
   * ({@code LoginActionsService.handleActionToken}) reports a link whose signature, issuer or
   * expiry fails as {@code EXECUTE_ACTION_TOKEN_ERROR} (the user is the one the link claims),
   * and a valid link refused afterwards (already used: {@code expired_code}; a disabled user)
   * as {@code RESET_PASSWORD_ERROR}; both carry the token's id and its action ({@value
   * #RESET_ACTION}). Reset errors without a token (the "forgot password" form's) tried no link
   * and are not published.
   */
  static boolean failedResetLink(EventType type, Map<String, String> details) {
    return (type == EventType.EXECUTE_ACTION_TOKEN_ERROR || type == EventType.RESET_PASSWORD_ERROR)
        && RESET_ACTION.equals(details.get(Details.ACTION))
        && details.get(Details.TOKEN_ID) != null;
  }

  /**
   * The sign-in that ends a reset through Keycloak's mailed link: the action-token endpoint
   * kept the verified link in the authentication session ({@code key} note), and the link's
   * action ({@code typ}) is {@value #RESET_ACTION}. Keycloak 26.5.6 reports the new password
   * as {@code UPDATE_PASSWORD} and then this {@code LOGIN}; it sends no {@code RESET_PASSWORD}.
   */
  static boolean endsResetLink(AuthenticationSessionModel auth) {
    String token = auth == null ? null : auth.getAuthNote(Constants.KEY);
    String[] parts = token == null ? new String[0] : token.split("\\.");
    if (parts.length < 2) {
      return false;
    }
    try {
      JsonNode claims = Attempts.mapper().readTree(Base64.getUrlDecoder().decode(parts[1]));
      return RESET_ACTION.equals(claims.path("typ").asText());
    } catch (IOException | IllegalArgumentException e) {
      return false;
    }
  }

  /** The account as typed (the {@code username} detail), else the user's username. */
  private String accountOf(Event event, Map<String, String> details) {
    String typed = details.get(Details.USERNAME);
    if (typed != null && !typed.isBlank()) {
      return typed;
    }
    if (event.getUserId() != null && event.getRealmId() != null) {
      RealmModel realm = session.realms().getRealm(event.getRealmId());
      UserModel user = realm == null ? null : session.users().getUserById(realm, event.getUserId());
      return user == null ? null : user.getUsername();
    }
    return null;
  }

  @Override
  public void onEvent(AdminEvent event, boolean includeRepresentation) {}

  @Override
  public void close() {}
}
