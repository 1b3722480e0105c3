// Reads Kafka records as a Kafka Connect sink would: the key and value bytes through Kafka Connect's
// own JsonConverter, then Debezium's ExtractNewRecordState transform, and prints what comes out.
//
// Usage: java -cp <jars>:<classes> DebeziumCheck profiles.json < records.jsonl > results.jsonl
//
// profiles.json: {"<profile>": {"key.schemas.enable": "true|false", "value.schemas.enable": "true|false",
//                 "transform": {<ExtractNewRecordState settings>} or null for none}, ...}
// records.jsonl: one {"profile": ..., "topic": ..., "key": base64|null, "value": base64|null} per line.
// results.jsonl: one line per record, in order: {"profile", "error" (null when accepted), "dropped"
//   (the transform returned no record), "keySchema", "valueSchema" (Connect schema names),
//   "valueFields" (field names of a struct value), "key", "value" (rendered as schemaless JSON)}.
//
// One JVM reads every record of a test run: the start is what costs.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;

import io.debezium.transforms.ExtractNewRecordState;

public final class DebeziumCheck {

    private static final ObjectMapper MAPPER = new ObjectMapper();

    private static final class Profile {
        final JsonConverter keyConverter = new JsonConverter();
        final JsonConverter valueConverter = new JsonConverter();
        final ExtractNewRecordState<SourceRecord> transform;

        Profile(JsonNode spec) {
            keyConverter.configure(converterConfig(spec.path("key.schemas.enable").asText("false")), true);
            valueConverter.configure(converterConfig(spec.path("value.schemas.enable").asText("false")), false);
            JsonNode settings = spec.path("transform");
            if (settings.isObject()) {
                Map<String, Object> config = new HashMap<>();
                for (Iterator<Map.Entry<String, JsonNode>> it = settings.fields(); it.hasNext();) {
                    Map.Entry<String, JsonNode> e = it.next();
                    config.put(e.getKey(), e.getValue().asText());
                }
                transform = new ExtractNewRecordState<>();
                transform.configure(config);
            }
            else {
                transform = null;
            }
        }
    }

    private static Map<String, Object> converterConfig(String schemasEnable) {
        Map<String, Object> config = new HashMap<>();
        config.put("schemas.enable", schemasEnable);
        config.put("decimal.format", "NUMERIC");
        return config;
    }

    // Renders Connect data (a Struct, a Map, a primitive) as plain JSON, as a schemaless sink would see it.
    private static final JsonConverter RENDER = new JsonConverter();

    static {
        RENDER.configure(converterConfig("false"), false);
    }

    private static JsonNode render(String topic, Schema schema, Object value) throws Exception {
        if (value == null) {
            return MAPPER.nullNode();
        }
        byte[] bytes = RENDER.fromConnectData(topic, schema, value);
        return MAPPER.readTree(bytes);
    }

    private static byte[] decode(JsonNode node) {
        return node == null || node.isNull() ? null : Base64.getDecoder().decode(node.asText());
    }

    private static ObjectNode check(Map<String, Profile> profiles, JsonNode input) {
        ObjectNode out = MAPPER.createObjectNode();
        String profileName = input.path("profile").asText();
        String topic = input.path("topic").asText();
        out.put("profile", profileName);
        Profile profile = profiles.get(profileName);
        try {
            if (profile == null) {
                throw new IllegalArgumentException("unknown profile " + profileName);
            }
            SchemaAndValue key = profile.keyConverter.toConnectData(topic, decode(input.get("key")));
            SchemaAndValue value = profile.valueConverter.toConnectData(topic, decode(input.get("value")));
            SourceRecord record = new SourceRecord(null, null, topic, 0, key.schema(), key.value(), value.schema(),
                    value.value());
            SourceRecord result = profile.transform == null ? record : profile.transform.apply(record);
            out.putNull("error");
            out.put("dropped", result == null);
            if (result != null) {
                out.put("keySchema", result.keySchema() == null ? null : result.keySchema().name());
                out.put("valueSchema", result.valueSchema() == null ? null : result.valueSchema().name());
                if (result.valueSchema() != null && result.valueSchema().type() == Schema.Type.STRUCT) {
                    ArrayNode fields = out.putArray("valueFields");
                    for (Field f : result.valueSchema().fields()) {
                        fields.add(f.name());
                    }
                }
                out.set("key", render(topic, result.keySchema(), result.key()));
                out.set("value", render(topic, result.valueSchema(), result.value()));
            }
        }
        catch (Exception e) {
            out.put("error", e.getClass().getName() + ": " + e.getMessage());
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        JsonNode spec = MAPPER.readTree(Files.readString(Path.of(args[0])));
        Map<String, Profile> profiles = new HashMap<>();
        for (Iterator<Map.Entry<String, JsonNode>> it = spec.fields(); it.hasNext();) {
            Map.Entry<String, JsonNode> e = it.next();
            profiles.put(e.getKey(), new Profile(e.getValue()));
        }
        List<String> lines = new ArrayList<>();
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                if (!line.isBlank()) {
                    lines.add(line);
                }
            }
        }
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        for (String line : lines) {
            out.println(MAPPER.writeValueAsString(check(profiles, MAPPER.readTree(line))));
        }
        out.flush();
    }
}
