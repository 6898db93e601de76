package io.authpipe.keycloak;

import java.util.List;
import java.util.Map;
import org.jboss.logging.Logger;
import org.keycloak.Config;
import org.keycloak.events.EventListenerProvider;
import org.keycloak.events.EventListenerProviderFactory;
import org.keycloak.models.KeycloakSession;
import org.keycloak.models.KeycloakSessionFactory;
import org.keycloak.models.RealmModel;
import org.keycloak.provider.ProviderConfigProperty;
import org.keycloak.sessions.AuthenticationSessionModel;

/**
 * The {@code authpipe} event listener: enable it per realm (Realm settings, Events, Event
 * listeners). It owns the one {@link Publisher} of the server, which the authenticators share
 * for the outcomes Keycloak's own events do not carry (a refusal, a CAPTCHA, a step-up).
 */
public final class AuthpipeEventListenerFactory implements EventListenerProviderFactory {

  public static final String ID = "authpipe";
  private static final Logger LOG = Logger.getLogger(AuthpipeEventListenerFactory.class);
  private static volatile Settings settings;
  private static volatile Publisher publisher;

  @Override
  public EventListenerProvider create(KeycloakSession session) {
    return new AuthpipeEventListener(session);
  }

  @Override
  public void init(Config.Scope config) {
    try {
      settings = Settings.from(config);
      publisher = Publisher.start(settings);
    } catch (RuntimeException e) {
      LOG.errorf("authpipe: bad settings (%s); login attempts are NOT published", e.getMessage());
      settings = null;
      publisher = null;
    }
  }

  @Override
  public void postInit(KeycloakSessionFactory factory) {}

  @Override
  public void close() {
    Publisher current = publisher;
    publisher = null;
    if (current != null) {
      current.close();
    }
  }

  @Override
  public String getId() {
    return ID;
  }

  @Override
  public List<ProviderConfigProperty> getConfigMetadata() {
    return Settings.metadata();
  }

  static Settings settings() {
    return settings;
  }

  /** The publisher's counters ({@code queued}, {@code sent}, the drops); empty when disabled. */
  public static Map<String, Long> counters() {
    Publisher current = publisher;
    return current == null ? Map.of() : current.counters();
  }

  /** Publish one record built by {@link Attempts#record}; never blocks, never throws. */
  static void publish(Map<String, Object> record) {
    Publisher current = publisher;
    if (current == null) {
      return;
    }
    try {
      current.offer((String) record.get("account"), Attempts.json(record));
    } catch (RuntimeException e) {
      LOG.warnf("authpipe: a record could not be queued: %s", e.toString());
    }
  }

  /** A record of this request, as an authenticator reports it (the flow's own outcome). */
  static void report(
      KeycloakSession session, RealmModel realm, String flow, String account, String outcome,
      String reason, String challenge) {
    Settings s = settings;
    if (s == null || account == null || account.isEmpty()) {
      return;
    }
    try {
      AuthenticationSessionModel auth = session.getContext().getAuthenticationSession();
      String sessionId = null; // Keycloak's LOGIN event carries the re-authenticated session
      Attempts.Client client = Attempts.client(session, s.clientAddress());
      if (auth != null) {
        client = client.trustFor(auth.getAuthenticatedUser());
      }
      publish(Attempts.record(null, System.currentTimeMillis(), s.tenantOf(realm.getName()),
          s.service(), flow, account, client, outcome, reason, challenge, sessionId));
    } catch (RuntimeException e) {
      LOG.warnf("authpipe: a record could not be built: %s", e.toString());
    }
  }
}
