package io.authpipe.keycloak;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import jakarta.ws.rs.core.Cookie;
import jakarta.ws.rs.core.HttpHeaders;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.keycloak.common.ClientConnection;
import org.keycloak.models.KeycloakSession;
import org.keycloak.models.UserModel;
import org.keycloak.sessions.AuthenticationSessionModel;

/**
 * The {@code login_attempt} v1 record (schemas/login_attempt.v1.json) as the provider builds it,
 * and what both the listener and the authenticators read from a request: the client address as
 * authpipe's contract defines it, the device cookie, the user agent.
 */
public final class Attempts {

  /** The device cookie the browser flow sets (an opaque random id; never trusted by itself). */
  public static final String DEVICE_COOKIE = "AUTHPIPE_DEVICE";
  /** Auth note: the device id issued in this authentication (the cookie reaches us next time). */
  public static final String NOTE_DEVICE = "authpipe.device";
  /** Auth note: the edge asked for a step-up on a right password. */
  public static final String NOTE_STEP_UP = "authpipe.step_up";
  /** Auth note and event detail: the sign-in completed a step-up. */
  public static final String NOTE_STEPPED_UP = "authpipe.stepped_up";
  public static final String DETAIL_CHALLENGE = "authpipe_challenge";

  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int MAX_ACCOUNT = 320;
  private static final int MAX_HOPS = 64;
  private static final int MAX_USER_AGENT = 512;

  private Attempts() {}

  /** User attribute: digests of the devices trusted for the user (a step-up passed there). */
  public static final String TRUSTED_ATTRIBUTE = "authpipe-trusted-devices";
  private static final int MAX_TRUSTED = 10;

  /**
   * The request's facts shared by a check and its records. {@code deviceTrusted}: the device
   * cookie came with the request and a step-up passed on it for this user before.
   */
  public record Client(String peerIp, List<String> forwardedFor, String deviceId, String userAgent,
      boolean fromCookie, boolean deviceTrusted) {

    /** This client with its trust for {@code user} looked up. */
    public Client trustFor(UserModel user) {
      boolean trusted = user != null && fromCookie && deviceId != null
          && user.getAttributeStream(TRUSTED_ATTRIBUTE).anyMatch(digest(deviceId)::equals);
      return new Client(peerIp, forwardedFor, deviceId, userAgent, fromCookie, trusted);
    }

    public Client withPeer(String peer) {
      return new Client(peer, List.of(), deviceId, userAgent, fromCookie, deviceTrusted);
    }
  }

  /** Trust this request's device cookie for {@code user} (the newest {@value #MAX_TRUSTED}). */
  public static void trust(UserModel user, Client client) {
    if (user == null || client.deviceId() == null) {
      return;
    }
    String mine = digest(client.deviceId());
    List<String> kept = new ArrayList<>(
        user.getAttributeStream(TRUSTED_ATTRIBUTE).filter(d -> !d.equals(mine)).toList());
    kept.add(mine);
    while (kept.size() > MAX_TRUSTED) {
      kept.remove(0);
    }
    user.setAttribute(TRUSTED_ATTRIBUTE, kept);
  }

  static String digest(String deviceId) {
    try {
      byte[] hash = java.security.MessageDigest.getInstance("SHA-256")
          .digest(deviceId.getBytes(java.nio.charset.StandardCharsets.UTF_8));
      return java.util.HexFormat.of().formatHex(hash, 0, 16);
    } catch (java.security.NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  public static Client client(KeycloakSession session, String addressMode) {
    ClientConnection connection = session.getContext().getConnection();
    HttpHeaders headers = session.getContext().getRequestHeaders();
    String peer = connection == null ? null : connection.getRemoteAddr();
    List<String> hops = new ArrayList<>();
    String userAgent = null;
    String device = null;
    boolean fromCookie = false;
    if (headers != null) {
      if (Settings.ADDRESS_CONNECTION.equals(addressMode)) {
        List<String> lines = headers.getRequestHeader("X-Forwarded-For");
        if (lines != null) {
          for (String line : lines) {
            for (String hop : line.split(",")) {
              if (!hop.isBlank() && hops.size() < MAX_HOPS) {
                hops.add(hop.trim());
              }
            }
          }
        }
      }
      userAgent = headers.getHeaderString(HttpHeaders.USER_AGENT);
      Cookie cookie = headers.getCookies().get(DEVICE_COOKIE);
      if (cookie != null && validDevice(cookie.getValue())) {
        device = cookie.getValue();
        fromCookie = true;
      }
    }
    AuthenticationSessionModel auth = session.getContext().getAuthenticationSession();
    if (device == null && auth != null) {
      device = auth.getAuthNote(NOTE_DEVICE);
    }
    if (userAgent != null && userAgent.length() > MAX_USER_AGENT) {
      userAgent = userAgent.substring(0, MAX_USER_AGENT);
    }
    return new Client(peer == null ? "0.0.0.0" : peer, hops, device, userAgent, fromCookie, false);
  }

  static boolean validDevice(String value) {
    return value != null && value.matches("[0-9a-f]{32}");
  }

  public static String newDeviceId() {
    return UUID.randomUUID().toString().replace("-", "");
  }

  /** One record; {@code reason}, {@code challenge} and {@code sessionId} may be null. */
  public static Map<String, Object> record(
      String eventId, long timeMs, String tenant, String service, String flow, String account,
      Client client, String outcome, String reason, String challenge, String sessionId) {
    Map<String, Object> r = new LinkedHashMap<>();
    r.put("event_id", eventId == null ? UUID.randomUUID().toString() : eventId);
    r.put("occurred_at", Instant.ofEpochMilli(timeMs).truncatedTo(ChronoUnit.MILLIS).toString());
    r.put("tenant", tenant);
    r.put("service", service);
    r.put("flow", flow);
    r.put("account", account.length() > MAX_ACCOUNT ? account.substring(0, MAX_ACCOUNT) : account);
    r.put("peer_ip", client.peerIp());
    r.put("forwarded_for", client.forwardedFor());
    if (client.deviceId() != null) {
      r.put("device_id", client.deviceId());
    }
    r.put("device_trusted", client.deviceId() != null && client.deviceTrusted());
    if (sessionId != null) {
      r.put("session_id", sessionId);
    }
    r.put("outcome", outcome);
    if (reason != null) {
      r.put("failure_reason", reason);
    }
    if (challenge != null) {
      r.put("challenge", challenge);
    }
    if (client.userAgent() != null) {
      r.put("user_agent", client.userAgent());
    }
    return r;
  }

  static String json(Object value) {
    try {
      return JSON.writeValueAsString(value);
    } catch (JsonProcessingException e) {
      throw new IllegalStateException(e);
    }
  }

  static ObjectMapper mapper() {
    return JSON;
  }
}
