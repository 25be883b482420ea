// Prints every PASSWORD-type config name that a ConfigDef in the given jars defines, one per line, sorted.
// Run by deploy/password_configs_gen.py with the jars' directory on the class path (Java's single-file launcher).
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.List;
import java.util.TreeSet;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;
import org.apache.kafka.common.config.ConfigDef;

public class PasswordConfigs {
    public static void main(String[] jars) throws Exception {
        TreeSet<String> names = new TreeSet<>();
        for (String path : jars) {
            try (JarFile jar = new JarFile(path)) {
                for (Enumeration<JarEntry> e = jar.entries(); e.hasMoreElements();) {
                    String entry = e.nextElement().getName();
                    if (!entry.endsWith(".class")) continue;
                    String name = entry.substring(0, entry.length() - 6).replace('/', '.');
                    // ConfigDefs live in classes named *Config, *Configs or *ConfigDef (KafkaConfig, LogConfig,
                    // ProducerConfig, BrokerSecurityConfigs, RestServerConfig$PublicConfig, ...).
                    if (!(name.endsWith("Config") || name.endsWith("Configs") || name.endsWith("ConfigDef"))) continue;
                    for (ConfigDef def : definitions(name)) {
                        for (ConfigDef.ConfigKey key : def.configKeys().values()) {
                            if (key.type == ConfigDef.Type.PASSWORD) names.add(key.name);
                        }
                    }
                }
            }
        }
        for (String name : names) System.out.println(name);
    }

    // Every ConfigDef a class exposes statically: fields and no-argument methods (configDef(), CONFIG, ...).
    static List<ConfigDef> definitions(String className) {
        List<ConfigDef> defs = new ArrayList<>();
        Class<?> c;
        try {
            c = Class.forName(className, true, PasswordConfigs.class.getClassLoader());
        } catch (Throwable t) {
            return defs; // optional dependencies missing: such a class has no ConfigDef we can reach
        }
        for (Field f : c.getDeclaredFields()) {
            if (Modifier.isStatic(f.getModifiers()) && ConfigDef.class.isAssignableFrom(f.getType())) {
                try {
                    f.setAccessible(true);
                    Object v = f.get(null);
                    if (v != null) defs.add((ConfigDef) v);
                } catch (Throwable t) {
                    // not readable: skipped
                }
            }
        }
        for (Method m : c.getDeclaredMethods()) {
            if (Modifier.isStatic(m.getModifiers()) && m.getParameterCount() == 0
                    && ConfigDef.class.isAssignableFrom(m.getReturnType())) {
                try {
                    m.setAccessible(true);
                    Object v = m.invoke(null);
                    if (v != null) defs.add((ConfigDef) v);
                } catch (Throwable t) {
                    // a factory that needs state: skipped
                }
            }
        }
        return defs;
    }
}
