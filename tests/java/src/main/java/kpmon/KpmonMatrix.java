package kpmon;

import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java kafka-clients side of kpmon's real-client matrix (tests/checks/test_client_matrix.py).
 * Every request goes through the tap at {@code args[1]}. Prints one {@code key=value} line per fact
 * the test asserts on.
 *
 * <ul>
 *   <li>{@code clean <bootstrap> <topic> <out-topic> <group>}: an idempotent producer; a transactional
 *       producer (transactions v2 on a 4.x broker: EndTxn v5 bumps the epoch on every commit) that
 *       commits and aborts; consume-transform-produce with a KIP-848 consumer
 *       ({@code group.protocol=consumer}) and {@code sendOffsetsToTransaction}; a classic consumer
 *       group; admin calls.
 *   <li>{@code zombie <bootstrap> <topic> <transactional id>}: two producers share a transactional
 *       id; the first (the zombie) writes after the second's initTransactions fenced it.
 *   <li>{@code share <bootstrap> <topic> <group>}: a KIP-932 share consumer reads and acknowledges.
 * </ul>
 */
public final class KpmonMatrix {
    private KpmonMatrix() {}

    private static Properties producerProps(String bootstrap, String clientId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        return p;
    }

    private static KafkaProducer<byte[], byte[]> transactional(String bootstrap, String clientId, String txnId) {
        Properties p = producerProps(bootstrap, clientId);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        return new KafkaProducer<>(p);
    }

    private static KafkaConsumer<byte[], byte[]> consumer(
            String bootstrap, String clientId, String group, String protocol) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return new KafkaConsumer<>(c);
    }

    private static ProducerRecord<byte[], byte[]> record(String topic, String value) {
        return new ProducerRecord<>(topic, 0, null, value.getBytes());
    }

    /** Polls until {@code want} records came or {@code seconds} passed; the records read. */
    private static List<ConsumerRecord<byte[], byte[]>> pollFor(
            KafkaConsumer<byte[], byte[]> consumer, int want, int seconds) {
        List<ConsumerRecord<byte[], byte[]>> out = new java.util.ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        while (out.size() < want && System.nanoTime() < deadline) {
            ConsumerRecords<byte[], byte[]> got = consumer.poll(Duration.ofMillis(500));
            got.forEach(out::add);
        }
        return out;
    }

    private static void clean(String bootstrap, String topic, String outTopic, String group) throws Exception {
        try (KafkaProducer<byte[], byte[]> idem = new KafkaProducer<>(producerProps(bootstrap, "java-idempotent"))) {
            for (int i = 0; i < 20; i++) {
                idem.send(record(topic, "idem-" + i));
            }
            idem.flush();
        }
        System.out.println("idempotent=20");
        try (KafkaProducer<byte[], byte[]> txn = transactional(bootstrap, "java-txn", group + "-txn")) {
            txn.initTransactions();
            for (int round = 0; round < 2; round++) {
                txn.beginTransaction();
                for (int i = 0; i < 5; i++) {
                    txn.send(record(topic, "txn-" + round + "-" + i));
                }
                txn.commitTransaction();
            }
            txn.beginTransaction();
            txn.send(record(topic, "aborted"));
            txn.flush();
            txn.abortTransaction();
        }
        System.out.println("transactions=committed:2,aborted:1");
        // Consume-transform-produce: a KIP-848 consumer, offsets committed inside the transaction.
        int moved = 0;
        try (KafkaConsumer<byte[], byte[]> in = consumer(bootstrap, "java-ctp-consumer", group + "-ctp", "consumer");
                KafkaProducer<byte[], byte[]> out = transactional(bootstrap, "java-ctp-producer", group + "-ctp-txn")) {
            out.initTransactions();
            in.subscribe(Collections.singletonList(topic));
            List<ConsumerRecord<byte[], byte[]>> got = pollFor(in, 30, 40);
            out.beginTransaction();
            Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : got) {
                out.send(new ProducerRecord<>(outTopic, 0, null, r.value()));
                offsets.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                moved++;
            }
            out.sendOffsetsToTransaction(offsets, in.groupMetadata());
            out.commitTransaction();
        }
        System.out.println("ctp_moved=" + moved);
        // A classic group, read-committed.
        try (KafkaConsumer<byte[], byte[]> classic = consumer(bootstrap, "java-classic", group + "-classic", "classic")) {
            classic.subscribe(Collections.singletonList(outTopic));
            System.out.println("classic_read=" + pollFor(classic, moved, 30).size());
        }
        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        a.put(AdminClientConfig.CLIENT_ID_CONFIG, "java-admin");
        try (Admin admin = Admin.create(a)) {
            System.out.println("admin_topics=" + admin.listTopics().names().get(10, TimeUnit.SECONDS).size());
            admin.describeCluster().clusterId().get(10, TimeUnit.SECONDS);
            admin.describeConsumerGroups(Collections.singletonList(group + "-ctp")).all().get(10, TimeUnit.SECONDS);
        }
    }

    private static void zombie(String bootstrap, String topic, String txnId) {
        KafkaProducer<byte[], byte[]> zombie = transactional(bootstrap, "kpmon-java-zombie", txnId);
        zombie.initTransactions();
        zombie.beginTransaction();
        zombie.send(record(topic, "before-fence"));
        zombie.flush();
        try (KafkaProducer<byte[], byte[]> fencer = transactional(bootstrap, "kpmon-java-fencer", txnId)) {
            fencer.initTransactions(); // bumps the epoch: the zombie is fenced
            String outcome = "accepted";
            try {
                zombie.send(record(topic, "after-fence")).get(30, TimeUnit.SECONDS);
                zombie.commitTransaction();
            } catch (Exception e) {
                Throwable cause = e.getCause() != null ? e.getCause() : e;
                outcome = "rejected: " + cause.getClass().getSimpleName();
            }
            System.out.println("zombie_write=" + outcome);
            fencer.beginTransaction();
            fencer.send(record(topic, "from-fencer"));
            fencer.commitTransaction();
        }
        zombie.close(Duration.ofSeconds(5));
    }

    private static void share(String bootstrap, String topic, String group) {
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps(bootstrap, "java-share-seed"))) {
            for (int i = 0; i < 10; i++) {
                producer.send(record(topic, "share-" + i));
            }
            producer.flush();
        }
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.CLIENT_ID_CONFIG, "java-share");
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        int read = 0;
        try (KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(c)) {
            consumer.subscribe(Collections.singletonList(topic));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            // A new share group starts at the latest offset: the records written after it joined are read.
            try (KafkaProducer<byte[], byte[]> late = new KafkaProducer<>(producerProps(bootstrap, "java-share-late"))) {
                while (read < 5 && System.nanoTime() < deadline) {
                    late.send(record(topic, "late"));
                    late.flush();
                    read += consumer.poll(Duration.ofMillis(1000)).count();
                    consumer.commitSync();
                }
            }
        }
        System.out.println("share_read=" + read);
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "clean" -> clean(args[1], args[2], args[3], args[4]);
            case "zombie" -> zombie(args[1], args[2], args[3]);
            case "share" -> share(args[1], args[2], args[3]);
            default -> throw new IllegalArgumentException("unknown mode " + args[0]);
        }
        System.out.flush();
        System.exit(0);
    }
}
