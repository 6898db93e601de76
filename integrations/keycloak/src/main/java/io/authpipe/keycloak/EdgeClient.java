package io.authpipe.keycloak;

import com.fasterxml.jackson.databind.JsonNode;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import org.jboss.logging.Logger;

/**
 * {@code GET /v1/check} on the authpipe edge. A GET carries the whole request in one write (a
 * POST's separate body write met Nagle and delayed ACK: 40 ms a login). The answer is read as
 * the reference login service reads it: {@code allowed} must be a boolean; a missing or bad
 * {@code retry_after_ms} is 0; an unknown {@code challenge} is a CAPTCHA; {@code step_up} is
 * also true when {@code challenge} is {@code step_up}. Any failure (timeout, refused
 * connection, a non-200, a body that is not the answer) fails open or closed as configured.
 */
final class EdgeClient {

  private static final Logger LOG = Logger.getLogger(EdgeClient.class);
  private static final HttpClient HTTP = HttpClient.newBuilder()
      .version(HttpClient.Version.HTTP_1_1)
      .connectTimeout(Duration.ofSeconds(2))
      .followRedirects(HttpClient.Redirect.NEVER)
      .build();

  /** The edge's answer; {@code reachable} is false for a fail-open or fail-closed stand-in. */
  record Answer(boolean allowed, long retryAfterMs, String challenge, boolean stepUp, boolean reachable) {}

  private EdgeClient() {}

  static Answer check(EdgeSettings edge, String tenant, String account, Attempts.Client client,
      String flow) {
    Map<String, String> query = new LinkedHashMap<>();
    query.put("tenant", tenant);
    query.put("account", account);
    query.put("ip", client.peerIp());
    if (!client.forwardedFor().isEmpty()) {
      query.put("forwarded_for", String.join(",", client.forwardedFor()));
    }
    if (client.deviceId() != null) {
      query.put("device", client.deviceId());
    }
    query.put("trusted", client.deviceId() != null && client.deviceTrusted() ? "true" : "false");
    query.put("flow", flow);
    StringBuilder url = new StringBuilder(edge.url()).append("/v1/check?");
    query.forEach((k, v) -> url.append(k).append('=')
        .append(URLEncoder.encode(v, StandardCharsets.UTF_8)).append('&'));
    url.setLength(url.length() - 1);
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(url.toString()))
        .timeout(Duration.ofMillis(edge.timeoutMs()))
        .header("Accept", "application/json")
        .GET();
    if (edge.token() != null) {
      request.header("Authorization", "Bearer " + edge.token());
    }
    try {
      HttpResponse<String> response =
          HTTP.sendAsync(request.build(), HttpResponse.BodyHandlers.ofString())
              .get(edge.timeoutMs(), java.util.concurrent.TimeUnit.MILLISECONDS);
      if (response.statusCode() != 200) {
        return failed(edge, "HTTP " + response.statusCode());
      }
      return read(Attempts.mapper().readTree(response.body()), edge);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return failed(edge, "interrupted");
    } catch (Exception e) {
      return failed(edge, e.getClass().getSimpleName());
    }
  }

  static Answer read(JsonNode body, EdgeSettings edge) {
    if (body == null || !body.isObject() || !body.path("allowed").isBoolean()) {
      return failed(edge, "an answer without a boolean 'allowed'");
    }
    JsonNode retry = body.path("retry_after_ms");
    long retryMs = retry.isIntegralNumber() && retry.asLong() > 0 ? retry.asLong() : 0;
    JsonNode kind = body.path("challenge");
    String challenge = null;
    if (kind.isTextual()) {
      challenge = kind.asText().equals("step_up") ? "step_up" : "captcha";
    } else if (!kind.isMissingNode() && !kind.isNull()) {
      challenge = "captcha";
    }
    boolean stepUp = body.path("step_up").asBoolean(false) || "step_up".equals(challenge);
    return new Answer(body.path("allowed").asBoolean(), retryMs, challenge, stepUp, true);
  }

  private static Answer failed(EdgeSettings edge, String why) {
    LOG.warnf("authpipe: the edge check failed (%s); failing %s", why,
        edge.failOpen() ? "open" : "closed");
    return new Answer(edge.failOpen(), 0, null, false, false);
  }
}
