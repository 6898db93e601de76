package io.authpipe.keycloak;

import java.util.Map;
import org.jboss.logging.Logger;
import org.keycloak.authentication.AuthenticatorUtil;
import org.keycloak.events.Details;
import org.keycloak.events.Errors;
import org.keycloak.events.Event;
import org.keycloak.events.EventListenerProvider;
import org.keycloak.events.EventType;
import org.keycloak.events.admin.AdminEvent;
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
 *   <li>{@code RESET_PASSWORD}: a reset completed through Keycloak's mailed link, {@code flow =
 *       "reset"}, {@code success}.
 * </ul>
 *
 * The edge's refusals, CAPTCHAs and step-ups are reported by the authenticators themselves
 * (Keycloak sends no event for them). Nothing here blocks or throws into Keycloak.
 */
public final class AuthpipeEventListener implements EventListenerProvider {

  private static final Logger LOG = Logger.getLogger(AuthpipeEventListener.class);
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
    if (type == EventType.LOGIN) {
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
