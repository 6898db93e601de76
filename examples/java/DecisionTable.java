// The authpipe decisions topic as a table, in Java, with the kafka-clients jar alone.
//
// Reads every partition of auth.throttle-decisions from the beginning to its end offset as
// of the start; a value sets its key, a null value (a tombstone: the decision was lifted
// or expired) deletes it. No consumer group: nothing is committed, a gateway rebuilds its
// table at every start (compaction keeps the topic small) and then follows it (here: it
// stops at the end and prints the table as one JSON object:
// {"records": n, "tombstones": n, "table": {key: decision}}).
//
// Settings: the same AUTHPIPE_KAFKA_* variables as every authpipe client
// (BOOTSTRAP_SERVERS, SECURITY_PROTOCOL, SASL_MECHANISM, SASL_USERNAME, SASL_PASSWORD,
// SSL_CAFILE, SSL_CERTFILE + SSL_KEYFILE for mutual TLS, all PEM; DECISIONS_TOPIC).
//
// Run (Java 17 runs a single source file):
//   java -cp "<dir with kafka-clients-*.jar and its dependencies>/*" DecisionTable.java
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class DecisionTable {
    private final Map<String, String> table = new TreeMap<>();
    private long records = 0;
    private long tombstones = 0;

    static String env(String name, String fallback) {
        String value = System.getenv("AUTHPIPE_KAFKA_" + name);
        return value == null || value.isEmpty() ? fallback : value;
    }

    /** Consumer properties from the AUTHPIPE_KAFKA_* variables (TLS from PEM files). */
    static Properties clientProperties() throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", env("BOOTSTRAP_SERVERS", "127.0.0.1:9092"));
        props.put("client.id", "java-gateway");
        String protocol = env("SECURITY_PROTOCOL", "PLAINTEXT");
        props.put("security.protocol", protocol);
        if (protocol.startsWith("SASL_")) {
            String mechanism = env("SASL_MECHANISM", "SCRAM-SHA-512");
            props.put("sasl.mechanism", mechanism);
            String module = mechanism.equals("PLAIN")
                ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                : "org.apache.kafka.common.security.scram.ScramLoginModule";
            props.put("sasl.jaas.config", module + " required username=\""
                + env("SASL_USERNAME", "") + "\" password=\"" + env("SASL_PASSWORD", "") + "\";");
        }
        String cafile = env("SSL_CAFILE", null);
        if (cafile != null) {
            props.put("ssl.truststore.type", "PEM");
            props.put("ssl.truststore.location", cafile);
        }
        String certfile = env("SSL_CERTFILE", null);
        String keyfile = env("SSL_KEYFILE", null);
        if (certfile != null && keyfile != null) {  // mutual TLS: key (PKCS#8 PEM) and chain
            props.put("ssl.keystore.type", "PEM");
            props.put("ssl.keystore.certificate.chain", Files.readString(Path.of(certfile)));
            props.put("ssl.keystore.key", Files.readString(Path.of(keyfile)));
        }
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return props;
    }

    void apply(byte[] key, byte[] value) {
        if (key == null) {
            return;  // every decision has a key
        }
        records++;
        String k = new String(key, StandardCharsets.UTF_8);
        if (value == null) {
            tombstones++;
            table.remove(k);
        } else {
            table.put(k, new String(value, StandardCharsets.UTF_8));
        }
    }

    /** Every partition from the beginning to its end offset as of now. */
    void load(KafkaConsumer<byte[], byte[]> consumer, String topic) {
        List<TopicPartition> partitions = new ArrayList<>();
        for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
            partitions.add(new TopicPartition(topic, info.partition()));
        }
        consumer.assign(partitions);
        consumer.seekToBeginning(partitions);
        Map<TopicPartition, Long> ends = new HashMap<>(consumer.endOffsets(partitions));
        long deadline = System.currentTimeMillis() + 60_000;
        while (ends.entrySet().stream().anyMatch(e -> consumer.position(e.getKey()) < e.getValue())) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("could not read " + topic + " to its end in 60 s");
            }
            for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
                TopicPartition tp = new TopicPartition(record.topic(), record.partition());
                if (record.offset() < ends.get(tp)) {
                    apply(record.key(), record.value());
                }
            }
        }
    }

    static String quote(String text) {
        return "\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    String json() {
        StringBuilder out = new StringBuilder("{\"records\": " + records + ", \"tombstones\": " + tombstones + ", \"table\": {");
        String sep = "";
        for (Map.Entry<String, String> e : table.entrySet()) {
            out.append(sep).append(quote(e.getKey())).append(": ").append(e.getValue());
            sep = ", ";
        }
        return out.append("}}").toString();
    }

    public static void main(String[] args) throws Exception {
        String topic = env("DECISIONS_TOPIC", "auth.throttle-decisions");
        DecisionTable decisions = new DecisionTable();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(clientProperties())) {
            decisions.load(consumer, topic);
        }
        System.out.println(decisions.json());
    }
}
