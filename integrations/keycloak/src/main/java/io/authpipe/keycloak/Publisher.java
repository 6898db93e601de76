package io.authpipe.keycloak;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;
import org.jboss.logging.Logger;

/**
 * Sends {@code login_attempt} records to Kafka from a bounded queue on its own thread, so a login
 * never waits for the broker and never fails because of it.
 *
 * <p>{@link #offer} only puts the record in the queue (or counts it dropped when the queue is
 * full or the publisher is disabled). The sender thread hands records to the producer; a send
 * the producer refuses at once (no metadata within {@code max.block.ms}: the broker is down) is
 * retried after a pause, the record staying at the head of the line, so a broker outage fills
 * the queue and only what overflows it is lost. A record the producer gives up on later (its
 * delivery timeout) is counted in {@code failed}. A producer that cannot be built at start (a
 * bad setting) is logged once and the publisher disabled: Keycloak runs on, nothing is sent.
 */
public final class Publisher implements AutoCloseable {

  private static final Logger LOG = Logger.getLogger(Publisher.class);
  private static final long RETRY_PAUSE_MS = 500;
  private static final long REPORT_EVERY_MS = 60_000;

  private record Item(String key, String value) {}

  private final String topic;
  private final BlockingQueue<Item> queue;
  private final Producer<String, String> producer;
  private final Thread thread;
  private volatile boolean closed;
  private final AtomicLong queued = new AtomicLong();
  private final AtomicLong sent = new AtomicLong();
  private final AtomicLong droppedFull = new AtomicLong();
  private final AtomicLong droppedDisabled = new AtomicLong();
  private final AtomicLong failed = new AtomicLong();

  /** A publisher that sends nothing and counts every offer dropped (settings were bad). */
  private Publisher(String topic) {
    this.topic = topic;
    this.queue = new ArrayBlockingQueue<>(1);
    this.producer = null;
    this.thread = null;
  }

  private Publisher(String topic, int capacity, Producer<String, String> producer) {
    this.topic = topic;
    this.queue = new ArrayBlockingQueue<>(capacity);
    this.producer = producer;
    this.thread = new Thread(this::run, "authpipe-publisher");
    this.thread.setDaemon(true);
    this.thread.start();
  }

  /** The publisher of {@code settings}; a disabled one (logged) if the producer cannot start. */
  public static Publisher start(Settings settings) {
    if (settings.bootstrapServers() == null || settings.bootstrapServers().isBlank()) {
      LOG.warn("authpipe: no bootstrap-servers set (spi-events-listener--authpipe--"
          + "bootstrap-servers); login attempts are not published");
      return new Publisher(settings.topic());
    }
    try {
      Producer<String, String> producer =
          new KafkaProducer<>(producerProperties(settings), new StringSerializer(),
              new StringSerializer());
      LOG.infof("authpipe: publishing login attempts to %s on %s (%s), queue %d",
          settings.topic(), settings.bootstrapServers(), settings.securityProtocol(),
          settings.queueCapacity());
      return new Publisher(settings.topic(), settings.queueCapacity(), producer);
    } catch (RuntimeException | IOException e) {
      LOG.errorf("authpipe: the Kafka producer could not start (%s); login attempts are NOT "
          + "published until the settings are fixed and Keycloak restarted", e.toString());
      return new Publisher(settings.topic());
    }
  }

  /** The producer's configuration: our guarantees, a short block, TLS/SASL as authpipe's own. */
  static Properties producerProperties(Settings s) throws IOException {
    Properties p = new Properties();
    if (s.propertiesFile() != null) {
      try (var in = Files.newBufferedReader(Path.of(s.propertiesFile()), StandardCharsets.UTF_8)) {
        p.load(in);
      }
    }
    p.put("bootstrap.servers", s.bootstrapServers());
    p.put("client.id", "authpipe-keycloak");
    p.put("acks", "all");
    p.put("enable.idempotence", "true");
    p.put("linger.ms", "5");
    p.putIfAbsent("max.block.ms", Long.toString(s.maxBlockMs()));
    p.putIfAbsent("delivery.timeout.ms", "120000");
    p.put("security.protocol", s.securityProtocol());
    if (s.securityProtocol().endsWith("SSL")) {
      if (s.sslCafile() != null) {
        p.put("ssl.truststore.type", "PEM");
        p.put("ssl.truststore.certificates", read(s.sslCafile()));
      }
      if (s.sslCertfile() != null && s.sslKeyfile() != null) {
        p.put("ssl.keystore.type", "PEM");
        p.put("ssl.keystore.certificate.chain", read(s.sslCertfile()));
        p.put("ssl.keystore.key", read(s.sslKeyfile()));
      }
    }
    if (s.securityProtocol().startsWith("SASL_")) {
      if (s.saslUsername() == null || s.saslPassword() == null) {
        throw new IllegalArgumentException(
            "security-protocol " + s.securityProtocol() + " needs sasl-username and sasl-password");
      }
      p.put("sasl.mechanism", s.saslMechanism());
      String module = s.saslMechanism().startsWith("SCRAM")
          ? "org.apache.kafka.common.security.scram.ScramLoginModule"
          : "org.apache.kafka.common.security.plain.PlainLoginModule";
      p.put("sasl.jaas.config", module + " required username=\"" + jaasEscape(s.saslUsername())
          + "\" password=\"" + jaasEscape(s.saslPassword()) + "\";");
    }
    return p;
  }

  private static String read(String path) throws IOException {
    return Files.readString(Path.of(path), StandardCharsets.UTF_8);
  }

  private static String jaasEscape(String text) {
    return text.replace("\\", "\\\\").replace("\"", "\\\"");
  }

  /** Queue one record; never blocks. False (and counted) when it is dropped. */
  public boolean offer(String key, String value) {
    if (producer == null || closed) {
      droppedDisabled.incrementAndGet();
      return false;
    }
    if (!queue.offer(new Item(key, value))) {
      droppedFull.incrementAndGet();
      return false;
    }
    queued.incrementAndGet();
    return true;
  }

  /** The counters: queued, sent (acknowledged), dropped_full, dropped_disabled, failed. */
  public Map<String, Long> counters() {
    return Map.of(
        "queued", queued.get(),
        "sent", sent.get(),
        "dropped_full", droppedFull.get(),
        "dropped_disabled", droppedDisabled.get(),
        "failed", failed.get(),
        "in_queue", (long) queue.size());
  }

  private void run() {
    long lastReport = System.currentTimeMillis();
    long lastLost = 0;
    Item item = null;
    while (!closed || item != null || !queue.isEmpty()) {
      try {
        if (item == null) {
          item = queue.poll(1, TimeUnit.SECONDS);
        }
        if (item != null) {
          producer.send(new ProducerRecord<>(topic, item.key(), item.value()), (meta, error) -> {
            if (error == null) {
              sent.incrementAndGet();
            } else {
              failed.incrementAndGet();
            }
          });
          item = null;
        }
      } catch (InterruptedException e) {
        if (closed) {
          break;
        }
      } catch (RuntimeException e) {
        // No metadata within max.block.ms (broker down) or a full buffer: keep the record,
        // pause, try again; the bounded queue takes what comes meanwhile.
        if (closed) {
          failed.incrementAndGet();
          item = null;
          continue;
        }
        pause();
      }
      long now = System.currentTimeMillis();
      long lost = droppedFull.get() + failed.get();
      if (now - lastReport >= REPORT_EVERY_MS && lost != lastLost) {
        LOG.warnf("authpipe: login attempts not delivered so far: %s", counters());
        lastReport = now;
        lastLost = lost;
      }
    }
  }

  private static void pause() {
    try {
      Thread.sleep(RETRY_PAUSE_MS);
    } catch (InterruptedException ignored) {
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public void close() {
    closed = true;
    if (thread != null) {
      try {
        thread.join(2000);
      } catch (InterruptedException ignored) {
        Thread.currentThread().interrupt();
      }
      thread.interrupt();
    }
    if (producer != null) {
      try {
        producer.close(java.time.Duration.ofSeconds(2));
      } catch (RuntimeException e) {
        LOG.warnf("authpipe: closing the producer: %s", e.toString());
      }
      LOG.infof("authpipe: publisher closed: %s", counters());
    }
  }
}
