package kpmon;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import org.apache.kafka.common.message.ApiMessageType;
import org.apache.kafka.common.message.RequestHeaderData;
import org.apache.kafka.common.message.ResponseHeaderData;
import org.apache.kafka.common.protocol.ApiMessage;
import org.apache.kafka.common.protocol.ByteBufferAccessor;
import org.apache.kafka.common.protocol.Message;
import org.apache.kafka.common.protocol.ObjectSerializationCache;

/**
 * Decodes Kafka frames with the generated message classes of whichever kafka-clients jar is on the
 * class path, for kpmon's differential test.
 *
 * <p>Input, one frame per line: {@code kind api_key api_version hex} (kind is {@code request} or
 * {@code response}; the hex is the frame without its size prefix). Output, one JSON object per line,
 * in the same order: {@code {"header": ..., "body": ..., "reencoded": hex, "from_json": hex}} where
 * header and body come from the generated {@code *JsonConverter.write}, {@code reencoded} is the frame
 * serialized again by the same message objects, and {@code from_json} is the frame serialized from
 * the message that {@code *JsonConverter.read} builds from that JSON (record sets come back empty:
 * the converters do not write their contents), and {@code trailing} holds any bytes left after the
 * body (Kafka's reader ignores them; the re-encodings leave them out). A frame Kafka cannot read gives
 * {@code {"error": "..."}}, an API or version the jar does not define {@code {"unsupported": true}};
 * a failing JSON read gives {@code "from_json_error"} next to the rest.
 */
public final class KpmonDiff {
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private static final HexFormat HEX = HexFormat.of();
    private static final Map<Class<?>, Method[]> CONVERTERS = new HashMap<>();

    private KpmonDiff() {}

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        BufferedWriter out = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            String[] parts = line.trim().split(" ");
            ObjectNode result;
            try {
                result = decode(parts[0], Short.parseShort(parts[1]), Short.parseShort(parts[2]),
                        parts.length > 3 ? HEX.parseHex(parts[3]) : new byte[0]);
            } catch (Throwable t) {
                result = MAPPER.createObjectNode();
                result.put("error", describe(t));
            }
            out.write(MAPPER.writeValueAsString(result));
            out.write('\n');
        }
        out.flush();
    }

    private static String describe(Throwable t) {
        Throwable cause = t instanceof InvocationTargetException && t.getCause() != null ? t.getCause() : t;
        return cause.getClass().getSimpleName() + ": " + cause.getMessage();
    }

    private static ObjectNode decode(String kind, short apiKey, short version, byte[] frame) throws Exception {
        ApiMessageType type;
        try {
            type = ApiMessageType.fromApiKey(apiKey);
        } catch (RuntimeException unknown) {
            return unsupported();
        }
        if (version < type.lowestSupportedVersion() || version > type.highestSupportedVersion(true)) {
            return unsupported();
        }
        ByteBuffer buf = ByteBuffer.wrap(frame);
        ByteBufferAccessor accessor = new ByteBufferAccessor(buf);
        boolean request = kind.equals("request");
        short headerVersion;
        Message header;
        ApiMessage body;
        if (request) {
            // The first two int16s are the api key and version; the header version follows from them.
            headerVersion = type.requestHeaderVersion(version);
            header = new RequestHeaderData(accessor, headerVersion);
            body = type.newRequest();
        } else {
            headerVersion = type.responseHeaderVersion(version);
            header = new ResponseHeaderData(accessor, headerVersion);
            body = type.newResponse();
        }
        body.read(accessor, version);
        ObjectNode result = MAPPER.createObjectNode();
        if (buf.hasRemaining()) {
            // Bytes after the body: Kafka's reader stops at the end of the message and leaves them.
            byte[] rest = new byte[buf.remaining()];
            buf.get(rest);
            result.put("trailing", HEX.formatHex(rest));
        }
        JsonNode headerJson = toJson(header, headerVersion, false);
        JsonNode bodyJson = toJson(body, version, false);
        result.set("header", headerJson);
        result.set("body", bodyJson);
        result.put("reencoded", HEX.formatHex(serialize(header, headerVersion, body, version)));
        try {
            Message header2 = fromJson(header.getClass(), headerJson, headerVersion);
            Message body2 = fromJson(body.getClass(), toJson(body, version, true), version);
            result.put("from_json", HEX.formatHex(serialize(header2, headerVersion, body2, version)));
        } catch (Throwable t) {
            result.put("from_json_error", describe(t));
        }
        return result;
    }

    /** This jar does not define the API or version: {@code {"unsupported": true}}. */
    private static ObjectNode unsupported() {
        ObjectNode result = MAPPER.createObjectNode();
        result.put("unsupported", true);
        return result;
    }

    private static byte[] serialize(Message header, short headerVersion, Message body, short version) {
        ObjectSerializationCache cache = new ObjectSerializationCache();
        int headerSize = header.size(cache, headerVersion);
        int bodySize = body.size(cache, version);
        ByteBuffer buf = ByteBuffer.allocate(headerSize + bodySize);
        ByteBufferAccessor accessor = new ByteBufferAccessor(buf);
        header.write(accessor, cache, headerVersion);
        body.write(accessor, cache, version);
        return buf.array();
    }

    /** The generated converter's {@code write(Data, short)} and {@code read(JsonNode, short)}. */
    private static Method[] converter(Class<?> messageClass) throws Exception {
        Method[] methods = CONVERTERS.get(messageClass);
        if (methods == null) {
            Class<?> conv = Class.forName(messageClass.getName() + "JsonConverter");
            methods = new Method[] {
                conv.getMethod("write", messageClass, short.class, boolean.class),
                conv.getMethod("read", JsonNode.class, short.class),
            };
            CONVERTERS.put(messageClass, methods);
        }
        return methods;
    }

    /**
     * With {@code serializeRecords} false a records field is written as {@code recordsSizeInBytes}; with
     * true it is written as empty bytes (the generated converters never write record contents).
     */
    private static JsonNode toJson(Message message, short version, boolean serializeRecords) throws Exception {
        return (JsonNode) converter(message.getClass())[0].invoke(null, message, version, serializeRecords);
    }

    private static Message fromJson(Class<?> messageClass, JsonNode json, short version) throws Exception {
        return (Message) converter(messageClass)[1].invoke(null, json, version);
    }
}
