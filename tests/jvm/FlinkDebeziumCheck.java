import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.List;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.formats.common.TimestampFormat;
import org.apache.flink.formats.json.debezium.DebeziumJsonDeserializationSchema;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.types.DataType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.RowType;
import org.apache.flink.table.types.logical.utils.LogicalTypeParser;
import org.apache.flink.table.types.utils.TypeConversions;
import org.apache.flink.util.Collector;
import org.apache.flink.util.UserCodeClassLoader;

public final class FlinkDebeziumCheck {
    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    public static void main(String[] args) throws Exception {
        RowType rowType = (RowType) LogicalTypeParser.parse(args[0], FlinkDebeziumCheck.class.getClassLoader());
        DataType dataType = TypeConversions.fromLogicalToDataType(rowType);
        DebeziumJsonDeserializationSchema schema = new DebeziumJsonDeserializationSchema(
                dataType, Collections.emptyList(), org.apache.flink.table.runtime.typeutils.InternalTypeInfo.of(rowType), false, false, TimestampFormat.ISO_8601);
        schema.open(new DeserializationSchema.InitializationContext() {
            public MetricGroup getMetricGroup() { return null; }
            public UserCodeClassLoader getUserCodeClassLoader() { return null; }
        });
        List<RowData.FieldGetter> getters = new ArrayList<>();
        List<LogicalType> types = rowType.getChildren();
        for (int i = 0; i < types.size(); i++) getters.add(RowData.createFieldGetter(types.get(i), i));
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            if (line.isBlank()) continue;
            List<RowData> rows = new ArrayList<>();
            String error = null;
            try {
                schema.deserialize(Base64.getDecoder().decode(line.trim()), new Collector<RowData>() {
                    public void collect(RowData r) { rows.add(r); }
                    public void close() {}
                });
            } catch (Exception e) {
                error = e.getClass().getName() + ": " + e.getMessage();
            }
            StringBuilder b = new StringBuilder("{\"error\":").append(error == null ? "null" : quote(error)).append(",\"rows\":[");
            for (int r = 0; r < rows.size(); r++) {
                RowData row = rows.get(r);
                if (r > 0) b.append(',');
                b.append("{\"kind\":").append(quote(row.getRowKind().shortString())).append(",\"fields\":[");
                for (int i = 0; i < getters.size(); i++) {
                    if (i > 0) b.append(',');
                    Object v = getters.get(i).getFieldOrNull(row);
                    b.append(v == null ? "null" : quote(v.toString()));
                }
                b.append("]}");
            }
            out.println(b.append("]}"));
        }
        out.flush();
    }
}
