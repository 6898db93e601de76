package io.authpipe.keycloak;

import java.util.List;
import java.util.Locale;
import java.util.regex.Pattern;
import org.keycloak.Config;
import org.keycloak.provider.ProviderConfigProperty;
import org.keycloak.provider.ProviderConfigurationBuilder;

/**
 * The event listener's settings ({@code spi-events-listener--authpipe--<name>}): where records
 * go, how to connect (the same TLS/SASL choices as authpipe's own clients), and what the records
 * say about their tenant, service and client address. Read once at start; frozen.
 */
public record Settings(
    String bootstrapServers,
    String topic,
    String securityProtocol,
    String saslMechanism,
    String saslUsername,
    String saslPassword,
    String sslCafile,
    String sslCertfile,
    String sslKeyfile,
    String propertiesFile,
    int queueCapacity,
    long maxBlockMs,
    String tenant,
    String service,
    String clientAddress) {

  static final Pattern TENANT = Pattern.compile("[a-z0-9][a-z0-9._-]{0,63}");
  static final List<String> PROTOCOLS = List.of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL");
  static final List<String> MECHANISMS = List.of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512");
  /** {@code connection}: the TCP peer and the X-Forwarded-For lines, for authpipe to walk. */
  static final String ADDRESS_CONNECTION = "connection";
  /** {@code keycloak}: Keycloak's resolved client address, no hops (proxy overwrites XFF). */
  static final String ADDRESS_KEYCLOAK = "keycloak";

  static Settings from(Config.Scope c) {
    String protocol = c.get("security-protocol", "PLAINTEXT").toUpperCase(Locale.ROOT);
    if (!PROTOCOLS.contains(protocol)) {
      throw new IllegalArgumentException("security-protocol " + protocol + ": use one of " + PROTOCOLS);
    }
    String mechanism = c.get("sasl-mechanism", "SCRAM-SHA-512").toUpperCase(Locale.ROOT);
    if (!MECHANISMS.contains(mechanism)) {
      throw new IllegalArgumentException("sasl-mechanism " + mechanism + ": use one of " + MECHANISMS);
    }
    String address = c.get("client-address", ADDRESS_CONNECTION);
    if (!address.equals(ADDRESS_CONNECTION) && !address.equals(ADDRESS_KEYCLOAK)) {
      throw new IllegalArgumentException("client-address " + address + ": use connection or keycloak");
    }
    String tenant = c.get("tenant");
    if (tenant != null && !TENANT.matcher(tenant).matches()) {
      throw new IllegalArgumentException("tenant " + tenant + " must match " + TENANT.pattern());
    }
    return new Settings(
        c.get("bootstrap-servers"),
        c.get("topic", "auth.login-attempts"),
        protocol,
        mechanism,
        c.get("sasl-username"),
        c.get("sasl-password"),
        c.get("ssl-cafile"),
        c.get("ssl-certfile"),
        c.get("ssl-keyfile"),
        c.get("producer-properties"),
        c.getInt("queue-capacity", 10_000),
        c.getLong("max-block-ms", 1000L),
        tenant,
        c.get("service", "keycloak"),
        address);
  }

  /** The tenant of a realm's records: the fixed {@code tenant}, else the realm's name folded. */
  String tenantOf(String realmName) {
    if (tenant != null) {
      return tenant;
    }
    String folded = realmName == null ? "" : realmName.toLowerCase(Locale.ROOT);
    return TENANT.matcher(folded).matches() ? folded : "default";
  }

  static List<ProviderConfigProperty> metadata() {
    return ProviderConfigurationBuilder.create()
        .property().name("bootstrap-servers").type("string")
        .helpText("Kafka bootstrap servers host:port[,host:port]; unset: nothing is published").add()
        .property().name("topic").type("string").defaultValue("auth.login-attempts")
        .helpText("topic of the login_attempt v1 records").add()
        .property().name("security-protocol").type("string").defaultValue("PLAINTEXT")
        .helpText("PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL").add()
        .property().name("sasl-mechanism").type("string").defaultValue("SCRAM-SHA-512")
        .helpText("PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512").add()
        .property().name("sasl-username").type("string").helpText("SASL user").add()
        .property().name("sasl-password").type("password").helpText("SASL password").add()
        .property().name("ssl-cafile").type("string").helpText("PEM file of the CA(s) that sign the broker").add()
        .property().name("ssl-certfile").type("string").helpText("PEM client certificate (mutual TLS)").add()
        .property().name("ssl-keyfile").type("string").helpText("PEM key of ssl-certfile (unencrypted PKCS#8)").add()
        .property().name("producer-properties").type("string")
        .helpText("a Kafka producer .properties file read first (anything else the producer takes)").add()
        .property().name("queue-capacity").type("int").defaultValue(10_000)
        .helpText("records held while the broker is slow or down; beyond it they are dropped and counted").add()
        .property().name("max-block-ms").type("long").defaultValue(1000L)
        .helpText("how long the sender thread waits for metadata before it retries (never a login)").add()
        .property().name("tenant").type("string")
        .helpText("the records' tenant; default: the realm's name, lower-cased").add()
        .property().name("service").type("string").defaultValue("keycloak")
        .helpText("the records' service").add()
        .property().name("client-address").type("string").defaultValue(ADDRESS_CONNECTION)
        .helpText("connection: the TCP peer plus X-Forwarded-For; keycloak: Keycloak's resolved address").add()
        .build();
  }
}
