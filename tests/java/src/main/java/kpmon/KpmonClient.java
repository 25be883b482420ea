package kpmon;

import java.io.InputStream;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterOptions;

/**
 * A real Java admin client for kpmon's golden frames: connects to {@code args[0]} (host:port) with
 * client id {@code args[1]} and asks for the cluster description, so it sends ApiVersions and then
 * Metadata/DescribeCluster. Whatever the listener answers, it gives up after a few seconds. Prints the
 * kafka-clients version it runs as (what it reports as its software version).
 */
public final class KpmonClient {
    private KpmonClient() {}

    /** The version kafka-clients reports (and sends as ClientSoftwareVersion), from its own resource. */
    static String clientsVersion() {
        Properties info = new Properties();
        try (InputStream in = Admin.class.getResourceAsStream("/kafka/kafka-version.properties")) {
            info.load(in);
        } catch (Exception e) {
            return "unknown";
        }
        return info.getProperty("version", "unknown");
    }

    public static void main(String[] args) {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, args[1]);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "3000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "4000");
        props.put(AdminClientConfig.RECONNECT_BACKOFF_MS_CONFIG, "1000");
        System.out.println(clientsVersion());
        System.out.flush();
        try (Admin admin = Admin.create(props)) {
            admin.describeCluster(new DescribeClusterOptions().timeoutMs(4000))
                    .clusterId()
                    .get(5, TimeUnit.SECONDS);
        } catch (Exception expected) {
            // The listener is not a broker; only the frames matter.
        }
        System.exit(0);
    }
}
