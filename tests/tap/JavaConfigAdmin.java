// The Java admin client sends password-type configs through the tap: CreateTopics, IncrementalAlterConfigs
// and DescribeConfigs. Run by tests/tap/test_config_redaction.py with Java's single-file launcher:
//   java -cp 'libs/*' JavaConfigAdmin.java <bootstrap> <broker id> <topic> <name=value> <name=value>
// The broker may refuse the configs; each request still crosses the tap, which is what the test needs.
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.config.ConfigResource;

public class JavaConfigAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("client.id", "kpmon-java-admin");
        String[] create = args[3].split("=", 2);
        String[] alter = args[4].split("=", 2);
        ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, args[1]);
        try (Admin admin = Admin.create(props)) {
            NewTopic topic = new NewTopic(args[2], 1, (short) 1).configs(Map.of(create[0], create[1]));
            report("CreateTopics", () -> admin.createTopics(List.of(topic)).all().get(30, TimeUnit.SECONDS));
            AlterConfigOp op = new AlterConfigOp(new ConfigEntry(alter[0], alter[1]), AlterConfigOp.OpType.SET);
            report("IncrementalAlterConfigs",
                () -> admin.incrementalAlterConfigs(Map.of(broker, List.of(op))).all().get(30, TimeUnit.SECONDS));
            report("DescribeConfigs", () -> admin.describeConfigs(List.of(broker)).all().get(30, TimeUnit.SECONDS));
        }
    }

    interface Call { Object run() throws Exception; }

    static void report(String rpc, Call call) {
        try {
            call.run();
            System.out.println(rpc + " ok");
        } catch (Exception e) {
            System.out.println(rpc + " refused: " + e.getClass().getSimpleName());
        }
    }
}
