package kpmon;

import java.nio.file.Files;
import java.time.Duration;
import java.util.Collections;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;

/**
 * A real Kafka Streams application on the KIP-1071 streams rebalance protocol
 * ({@code group.protocol=streams}), for kpmon's real-client matrix. Compiled on its own against the
 * kafka-streams jar and its kafka-clients (tests/java/harness.py, {@code streams_command}).
 *
 * <p>{@code <bootstrap> <in-topic> <out-topic> <application id>}: writes 10 records to the input, runs
 * a stateless topology (upper-case the values) until its output holds them, then closes. Prints
 * {@code key=value} lines the test asserts on.
 */
public final class KpmonStreams {
    private KpmonStreams() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], in = args[1], out = args[2], app = args[3];
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "kpmon-streams-source");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < 10; i++) {
                producer.send(new ProducerRecord<>(in, ("k" + i).getBytes(), ("v" + i).getBytes())).get(30, TimeUnit.SECONDS);
            }
        }
        StreamsBuilder builder = new StreamsBuilder();
        builder.<byte[], byte[]>stream(in).mapValues(v -> new String(v).toUpperCase().getBytes()).to(out);
        Properties s = new Properties();
        s.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        s.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        s.put(StreamsConfig.CLIENT_ID_CONFIG, "kpmon-streams");
        s.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "streams");
        s.put(StreamsConfig.STATE_DIR_CONFIG, Files.createTempDirectory("kpmon-streams").toString());
        s.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class.getName());
        s.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class.getName());
        s.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        s.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "500");
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.CLIENT_ID_CONFIG, "kpmon-streams-sink");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        int moved = 0;
        try (KafkaStreams streams = new KafkaStreams(builder.build(), s);
                KafkaConsumer<byte[], byte[]> sink = new KafkaConsumer<>(c)) {
            streams.start();
            sink.assign(Collections.singletonList(new org.apache.kafka.common.TopicPartition(out, 0)));
            sink.seekToBeginning(sink.assignment());
            long deadline = System.currentTimeMillis() + 90_000;
            while (moved < 10 && System.currentTimeMillis() < deadline) {
                moved += sink.poll(Duration.ofMillis(500)).count();
            }
            System.out.println("streams_state=" + streams.state());
            streams.close(Duration.ofSeconds(20));
        }
        System.out.println("streams_moved=" + moved);
        System.out.flush();
        System.exit(0);
    }
}
