"""The import rules of the design, checked on the source: each layer crossed once, in one direction.

- core is the Delta protocol: it imports only the standard library, pyarrow, fsspec and pydantic;
- mirror is the wire: it imports core (never producer, consumer or the CLI);
- producer and consumer import core and mirror, never each other;
- ops (the metrics and health server) imports only core, the standard library and prometheus_client;
- confluent_kafka is imported only in mirror (and the local broker helper, for admin calls), and its
  clients are made only by mirror/kafka/clients.py, which routes librdkafka's logs (none reaches stderr raw);
- only consumer/spark/source.py imports pyspark;
- the CLI imports the packages only inside functions (lazily), except its own modules;
- devkafka (the development broker) is a tool: no package of the product imports it;
- no import cycle between modules at import time;
- the faces: each package lists its API in ``__all__``, and README.md, docs/ and examples/ import
  nothing else (every other module is private and may move);
- topic names are made and checked by mirror/topic_names.py only; a table's features are decided by
  core; no module switches on a row-change format's name (one class per format, by the registry);
- the rooms: inside a package, which sub-packages and top modules may import which is declared
  (``ROOMS``), and the declared graph has no cycle.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "core": "deltamirror.core",
    "mirror": "deltamirror.mirror",
    "ops": "deltamirror.ops",
    "producer": "deltamirror.producer",
    "consumer": "deltamirror.consumer",
    "cli": "deltamirror.cli",
    "devkafka": "deltamirror.devkafka",
}
CORE_ALLOWED = {"pyarrow", "fsspec", "pydantic", "pydantic_core"}
#: msgspec decodes the file actions at the log boundary, and nowhere else in core
BOUNDARY_ONLY = {"msgspec": {"core/action_rules.py", "core/actions.py"}}
SPARK_MODULES = {"consumer/spark/source.py"}
#: where confluent_kafka may be imported: the wire package, and the development broker's admin calls
KAFKA_CLIENT_HOMES = ("mirror/", "devkafka/")


def _imports(path: Path, package: str) -> list[tuple[str, int, bool]]:
    """(absolute module, line, at module level) for every import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    rel_parts = path.relative_to(ROOT).with_suffix("").parts
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = [*package.split("."), *rel_parts[1:-1]]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                names = [".".join([*base, node.module] if node.module else base)]
            else:
                names = [node.module or ""]
        else:
            continue
        top_level = True
        p = parents.get(node)
        while p is not None:
            if isinstance(p, ast.FunctionDef | ast.AsyncFunctionDef):
                top_level = False
            p = parents.get(p)
        out.extend((n, node.lineno, top_level) for n in names)
    return out


@contextlib.contextmanager
def _rooted_at(path: Path) -> Iterator[None]:
    """The checkers read ``path`` as the repository, for a test that plants a file there."""
    global ROOT
    real_root, ROOT = ROOT, path
    try:
        yield
    finally:
        ROOT = real_root


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module == "__future__"


@pytest.mark.parametrize("path", _files("core"), ids=lambda p: p.name)
def test_core_imports_only_stdlib_pyarrow_fsspec_pydantic(path: Path) -> None:
    for module, line, _ in _imports(path, "deltamirror.core"):
        top = module.split(".")[0]
        ok = _is_stdlib(module) or top in CORE_ALLOWED or module.startswith("deltamirror.core")
        ok = ok or str(path.relative_to(ROOT)) in BOUNDARY_ONLY.get(top, ())
        assert ok, f"{path.relative_to(ROOT)}:{line} imports {module}"


@pytest.mark.parametrize("path", _files("mirror"), ids=lambda p: p.name)
def test_mirror_imports_core_and_never_the_layers_above(path: Path) -> None:
    for module, line, _ in _imports(path, "deltamirror.mirror"):
        assert not module.startswith(("deltamirror.producer", "deltamirror.consumer", "deltamirror.cli")), (
            f"{path.relative_to(ROOT)}:{line} imports {module}"
        )


@pytest.mark.parametrize("path", _files("ops"), ids=lambda p: p.name)
def test_ops_imports_only_core_stdlib_and_prometheus_client(path: Path) -> None:
    """The server every command serves stands below producer and consumer: it knows no command."""
    for module, line, _ in _imports(path, "deltamirror.ops"):
        ok = (
            _is_stdlib(module)
            or module.split(".")[0] == "prometheus_client"
            or module.startswith(("deltamirror.core", "deltamirror.ops"))
        )
        assert ok, f"{path.relative_to(ROOT)}:{line} imports {module}"


@pytest.mark.parametrize(
    ("folder", "forbidden"), [("producer", "deltamirror.consumer"), ("consumer", "deltamirror.producer")]
)
def test_producer_and_consumer_do_not_import_each_other(folder: str, forbidden: str) -> None:
    for path in _files(folder):
        for module, line, _ in _imports(path, PACKAGES[folder]):
            assert not module.startswith(forbidden), f"{path.relative_to(ROOT)}:{line} imports {module}"
            assert not module.startswith("deltamirror.cli"), (
                f"{path.relative_to(ROOT)}:{line} imports the CLI"
            )


@pytest.mark.parametrize("folder", ["core", "mirror", "ops", "producer", "consumer"])
def test_no_package_of_the_product_imports_the_development_broker(folder: str) -> None:
    for path in _files(folder):
        for module, line, _ in _imports(path, PACKAGES[folder]):
            assert not module.startswith("deltamirror.devkafka"), (
                f"{path.relative_to(ROOT)}:{line} imports {module}"
            )


@pytest.mark.parametrize("path", _files("devkafka"), ids=lambda p: p.name)
def test_the_development_broker_stands_on_core_and_the_wire(path: Path) -> None:
    for module, line, _ in _imports(path, "deltamirror.devkafka"):
        assert not module.startswith(("deltamirror.producer", "deltamirror.consumer", "deltamirror.cli")), (
            f"{path.relative_to(ROOT)}:{line} imports {module}"
        )


def test_only_the_wire_package_imports_confluent_kafka() -> None:
    for folder in PACKAGES:
        for path in _files(folder):
            rel = str(path.relative_to(ROOT))
            for module, line, _ in _imports(path, PACKAGES[folder]):
                if module.split(".")[0] == "confluent_kafka":
                    assert rel.startswith(KAFKA_CLIENT_HOMES), f"{rel}:{line} imports {module}"


#: where the serializer libraries of the registry formats may be imported (their extras)
SERIALIZER_HOMES = {"fastavro": ("mirror/records/",), "google": ("mirror/records/",)}


def test_only_the_registry_formats_import_their_serializer_libraries() -> None:
    """fastavro and protobuf (``google.protobuf``, ``google.type``) are extras (deltamirror[avro],
    deltamirror[protobuf]): only the formats' modules in mirror/records import them, when chosen."""
    for folder in PACKAGES:
        for path in _files(folder):
            rel = str(path.relative_to(ROOT))
            for module, line, _ in _imports(path, PACKAGES[folder]):
                homes = SERIALIZER_HOMES.get(module.split(".")[0])
                if homes is not None:
                    assert rel.startswith(homes), f"{rel}:{line} imports {module}"


#: the one module that calls confluent-kafka's client constructors
CLIENT_MAKER = "mirror/kafka/clients.py"
CLIENT_CLASSES = frozenset({"Producer", "Consumer", "AdminClient"})


def _client_constructions(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every call of a confluent-kafka client class in a file, however imported."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bound: set[str] = set()  # local names of the classes (from confluent_kafka[.admin] import X as Y)
    modules: set[str] = set()  # local names of confluent_kafka and its submodules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "confluent_kafka":
            bound |= {a.asname or a.name for a in node.names if a.name in CLIENT_CLASSES}
            modules |= {a.asname or a.name for a in node.names if a.name == "admin"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name.split(".")[0] == "confluent_kafka"}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in bound:
            found.append((node.lineno, func.id))
        elif isinstance(func, ast.Attribute) and func.attr in CLIENT_CLASSES:
            base = ast.unparse(func.value)
            if base in modules or base.split(".")[0] in modules:
                found.append((node.lineno, f"{base}.{func.attr}"))
    return found


def test_every_kafka_client_is_made_where_its_logs_are_routed() -> None:
    """A client made elsewhere would write librdkafka's raw lines to stderr (a dead broker: tens a second)."""
    for folder in PACKAGES:
        for path in _files(folder):
            rel = str(path.relative_to(ROOT))
            if rel == CLIENT_MAKER:
                continue
            for line, name in _client_constructions(path):
                raise AssertionError(
                    f"{rel}:{line} makes a Kafka client with {name}(): use deltamirror.mirror.kafka.clients"
                )


def test_the_client_check_finds_each_spelling(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import confluent_kafka as ck\nfrom confluent_kafka import Producer as P\n"
        "from confluent_kafka import admin\nP({})\nck.Consumer({})\nadmin.AdminClient({})\n"
    )
    assert [name for _, name in _client_constructions(planted)] == ["P", "ck.Consumer", "admin.AdminClient"]
    assert [name for _, name in _client_constructions(ROOT / CLIENT_MAKER)] == [
        "Producer",
        "Consumer",
        "AdminClient",
    ]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_time_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports while being imported (not in functions, not for typing)."""
    modules = {_module_name(p): p for folder in PACKAGES for p in _files(folder)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        later = {  # imports that do not run at import time: in functions, or for the type checker only
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            or (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
            for n in ast.walk(node)
        }
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in later:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join([*base, node.module] if node.module else base)
                else:
                    mod = node.module or ""
                # "from pkg import mod" imports the module pkg.mod; "from mod import name" imports mod
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_import_cycle_between_modules() -> None:
    cycle = _cycle(_import_time_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_only_the_spark_module_imports_pyspark() -> None:
    for folder in PACKAGES:
        for path in _files(folder):
            rel = str(path.relative_to(ROOT))
            for module, line, _ in _imports(path, PACKAGES[folder]):
                if module.split(".")[0] == "pyspark":
                    assert rel in SPARK_MODULES, f"{rel}:{line} imports pyspark"


def test_cli_imports_the_packages_lazily() -> None:
    for path in _files("cli"):
        for module, line, top_level in _imports(path, "deltamirror.cli"):
            if module.startswith(
                (
                    "deltamirror.producer",
                    "deltamirror.consumer",
                    "deltamirror.core",
                    "deltamirror.mirror",
                    "deltamirror.ops",
                    "deltamirror.devkafka",
                )
            ):
                assert not top_level, f"{path.relative_to(ROOT)}:{line} imports {module} at module level"


def test_the_rule_checker_sees_a_violation(tmp_path: Path) -> None:
    """The checks above can fail: a planted bad import is found (planted outside the source tree)."""
    planted = tmp_path / "core" / "planted.py"
    planted.parent.mkdir()
    planted.write_text("import confluent_kafka\nfrom ..producer import watcher\n")
    with _rooted_at(tmp_path):
        found = [m for m, _, _ in _imports(planted, "deltamirror.core")]
    assert "confluent_kafka" in found and "deltamirror.producer" in found
    assert not (_is_stdlib("confluent_kafka") or "confluent_kafka" in CORE_ALLOWED)


def test_the_wire_format_lives_in_one_module() -> None:
    """Envelope field names appear only in mirror/records/events.py; everyone else goes through it."""
    owners = set()
    for folder in PACKAGES:
        for path in _files(folder):
            text = path.read_text()
            if '"schemaVersion"' in text or '"commitTimestampSource"' in text:
                owners.add(str(path.relative_to(ROOT)))
    assert owners == {"mirror/records/events.py"}


#: where the topics' records are written: one encoder per topic
ENCODERS_HOME = "mirror/records/"


def _hand_made_records(path: Path) -> list[str]:
    """Where ``path`` writes a record's bytes itself: a record model serialized (``to_json_bytes()``)
    or a header pair built from a ``HEADER_`` name (``(HEADER_KIND, b"commit")``,
    ``(HEADER_PREFIX + "topic", ...)``)."""

    def header_name(node: ast.expr) -> bool:
        if isinstance(node, ast.BinOp):
            return header_name(node.left)
        return isinstance(node, ast.Name) and node.id.startswith("HEADER_")

    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "to_json_bytes"
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} serializes a record model")
        elif isinstance(node, ast.Tuple) and node.elts and header_name(node.elts[0]):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} writes a header")
    return found


def test_records_are_written_by_the_wire_package_s_encoders_only() -> None:
    """The producer, the consumers and the CLI send what mirror/records' encoders return: none of
    them serializes a record model or writes a header itself."""
    found = [
        where
        for folder in PACKAGES
        for path in _files(folder)
        if not str(path.relative_to(ROOT)).startswith(ENCODERS_HOME)
        for where in _hand_made_records(path)
    ]
    assert not found, "records are encoded in mirror/records (one encoder per topic): " + "; ".join(found)


def test_the_record_checker_sees_a_hand_made_record(tmp_path: Path) -> None:
    with _rooted_at(tmp_path):
        planted = tmp_path / "producer" / "x.py"
        planted.parent.mkdir()
        planted.write_text(
            "def f(pub, summary, p):\n"
            "    pub.produce('t', summary.to_json_bytes(), b'k', [(HEADER_KIND, b'commit')])\n"
            "    return [(HEADER_PREFIX + 'topic', p)]\n"
        )
        found = _hand_made_records(planted)
    assert [f.split(" ", 1)[1] for f in found] == [
        "serializes a record model",
        "writes a header",
        "writes a header",
    ]


# --- row-change formats: one class each, found by the registry ---------------------------------

#: a format's name that only the registry (and the setting's Literal) spells
_FORMAT_NAMES = ("json-schema",)


def _format_switches(path: Path) -> list[str]:
    """Where ``path`` compares something with a row-change format's name (an if/elif on formats)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in _FORMAT_NAMES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_switches_on_a_row_change_format() -> None:
    """A format is one class of mirror/records/row_formats.py (its bytes, its values, its Spark
    DDL), found by the registry: nothing compares a format's name to choose what to do."""
    found = [where for folder in PACKAGES for path in _files(folder) for where in _format_switches(path)]
    assert found == [], "look the format's class up (row_change_serializer): " + ", ".join(found)


def test_the_format_switch_checker_sees_a_switch(tmp_path: Path) -> None:
    planted = tmp_path / "x.py"
    planted.write_text("def ddl(fmt):\n    return 'BINARY' if fmt == 'json-schema' else 'DECIMAL'\n")
    with _rooted_at(tmp_path):
        assert _format_switches(planted) == ["x.py:2"]


# --- a table's features: decided in core ------------------------------------------------------


@pytest.mark.parametrize("folder", [f for f in PACKAGES if f != "core"])
def test_only_core_decides_whether_a_table_is_readable(folder: str) -> None:
    """Whether a table's protocol and schema are readable is core's rule (core/features.py, applied
    by core's readers: a snapshot, a head, a version's scan): the producer asks core, never the rule."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _files(folder)
        for module, line, _ in _imports(path, PACKAGES[folder])
        if module == "deltamirror.core.features"
        or (module == "deltamirror.core" and "import features" in path.read_text())
    ]
    assert bad == [], "feature checks are core's (read_head, DeltaTable.snapshot): " + ", ".join(bad)


# --- topic names: one rule, in the wire package --------------------------------------------------

#: where every topic name is made or checked (the default names, the suffixes, the characters Kafka takes)
TOPIC_NAMES_HOME = "mirror/topic_names.py"
#: a copy spelled out where importing the wire would slow ``--help`` (a test holds it equal)
TOPIC_NAME_COPIES = {"cli/signal_cmd.py": "SIGNAL_TOPIC"}
_TOPIC_NAME_MARKS = ("A-Za-z0-9._-",)
_TOPIC_NAME_PARTS = (".actions", ".commits", ".changes", ".transaction", ".shards", "deltamirror.progress")


def _topic_name_rules(path: Path) -> list[str]:
    """Where ``path`` spells a topic-name rule: the characters a topic name may hold, a suffix of
    the default names, or a default topic."""
    tree = ast.parse(path.read_text(), filename=str(path))
    loggers = {  # a logger's name is no topic
        id(arg)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "attr", getattr(call.func, "id", "")) == "getLogger"
        for arg in call.args
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in loggers:
            continue
        text = node.value
        if (
            any(m in text for m in _TOPIC_NAME_MARKS)
            or text in _TOPIC_NAME_PARTS
            or text == "deltamirror.signals"
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {text!r}")
    return found


def test_only_the_wire_package_names_topics() -> None:
    """The topic-name rules (which names Kafka takes, the default names of a table, a discovered
    table, a group, the progress and signal topics) are mirror/topic_names.py's alone."""
    found = [
        where
        for folder in PACKAGES
        for path in _files(folder)
        if str(path.relative_to(ROOT)) not in (TOPIC_NAMES_HOME, *TOPIC_NAME_COPIES)
        for where in _topic_name_rules(path)
    ]
    assert not found, "topic names are made and checked in " + TOPIC_NAMES_HOME + ": " + "; ".join(found)


def test_the_spelled_out_topic_names_equal_the_rule() -> None:
    from deltamirror.mirror import topic_names

    for rel, name in TOPIC_NAME_COPIES.items():
        module = importlib.import_module(PACKAGES[rel.split("/")[0]] + "." + rel.split("/", 1)[1][:-3])
        assert getattr(module, name) == getattr(topic_names, name), rel


def test_the_topic_name_checker_sees_a_rule(tmp_path: Path) -> None:
    with _rooted_at(tmp_path):
        planted = tmp_path / "consumer" / "x.py"
        planted.parent.mkdir()
        planted.write_text(
            "import re\n_NAME = re.compile(r'^[A-Za-z0-9._-]{1,249}$')\n"
            "def commits(name):\n    return 'deltamirror.' + name + '.commits'\n"
        )
        found = _topic_name_rules(planted)
    assert len(found) == 2 and "A-Za-z0-9" in found[0] and "'.commits'" in found[1], found


#: the one home of a finished record's type (``Record``, ``KeyedRecords``); a record read back from
#: a topic (with its partition and offset) is the read loop's
RECORD_TYPES_HOME = "mirror/records/record.py"
RECORDS_READ_HOME = "mirror/kafka/consumer.py"


def _record_types(path: Path) -> list[str]:
    """Classes of ``path`` that hold a record to produce: a key with a value (or values)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ClassDef):
            fields = {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
            if "key" in fields and fields & {"value", "values"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return found


def test_every_encoder_returns_the_one_record_type() -> None:
    """One finished-record type (mirror/records/record.py) for every topic's encoder: no module
    declares another class of key and value to hand records to the producer."""
    found = [
        where
        for folder in PACKAGES
        for path in _files(folder)
        if str(path.relative_to(ROOT)) not in (RECORD_TYPES_HOME, RECORDS_READ_HOME)
        for where in _record_types(path)
    ]
    assert found == [], "encoders return mirror/records/record.py's Record: " + ", ".join(found)


def test_the_record_type_checker_sees_a_second_type(tmp_path: Path) -> None:
    planted = tmp_path / "x.py"
    planted.write_text("class RowRecord:\n    topic: str\n    key: bytes\n    value: bytes | None\n")
    with _rooted_at(tmp_path):
        assert _record_types(planted) == ["x.py:1 RowRecord"]


# --- one choke point for every open of table data ---------------------------------------------

#: the package that opens table files (and holds every path to the table root first): TableStorage,
#: with the real-path-checked local opens (storage/local.py) that only it may use
OPEN_CHOKE_POINT = "core/storage/"
#: callables that open or read a file by name, by their qualified names
FORBIDDEN_OPENS = {
    "open",
    "io.open",
    "io.FileIO",
    "codecs.open",
    "os.open",
    "os.fdopen",
    "fsspec.open",
    "fsspec.open_files",
    "fsspec.filesystem",
    "fsspec.core.url_to_fs",
    "fsspec.core.open",
    "pyarrow.OSFile",
    "pyarrow.memory_map",
    "pyarrow.input_stream",
    "pyarrow.fs.LocalFileSystem",
    "pyarrow.parquet.read_table",
    "pyarrow.parquet.ParquetFile",
    "pyarrow.parquet.read_metadata",
    "pyarrow.parquet.read_schema",
    "pyarrow.parquet.read_pandas",
    "pyarrow.parquet.ParquetDataset",
}
#: modules whose mere import in core (outside the choke point) means a way around it
FORBIDDEN_MODULES = ("pathlib", "fsspec", "pyarrow.fs", "pyarrow.dataset", "pyarrow.csv", "pyarrow.json")
#: methods that read through a filesystem object or a path object, whatever it is called
FORBIDDEN_METHODS = {"read_text", "open_input_file", "open_input_stream", "cat_file", "cat", "read_block"}


def _qualified(node: ast.expr, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    head = aliases.get(node.id, node.id)
    return ".".join([head, *reversed(parts)])


def opens_outside_storage(source: str, filename: str = "<core module>") -> list[str]:
    """Every way ``source`` opens or reads a file itself instead of through TableStorage."""
    tree = ast.parse(source, filename=filename)
    aliases: dict[str, str] = {}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name.startswith(FORBIDDEN_MODULES):
                    found.append(f"{filename}:{node.lineno} imports {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                full = f"{node.module}.{a.name}"
                if node.module.startswith(FORBIDDEN_MODULES) or full.startswith(FORBIDDEN_MODULES):
                    found.append(f"{filename}:{node.lineno} imports {full}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _qualified(node.func, aliases)
        if name in FORBIDDEN_OPENS:
            found.append(f"{filename}:{node.lineno} calls {name}")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_METHODS:
            found.append(f"{filename}:{node.lineno} calls .{node.func.attr}()")
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "open":
            # storage.open(path) is the choke point itself; any other receiver (a Path, a filesystem)
            # opens behind its back
            owner = node.func.value
            receiver = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if receiver != "storage":
                found.append(f"{filename}:{node.lineno} calls {receiver or '?'}.open()")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("read_bytes", "parquet_file"):
            owner = node.func.value
            receiver = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if receiver != "storage":
                found.append(f"{filename}:{node.lineno} calls {receiver or '?'}.{node.func.attr}()")
    return found


@pytest.mark.parametrize("path", _files("core"), ids=lambda p: p.name)
def test_core_opens_table_files_only_through_storage(path: Path) -> None:
    """Data files, change data files, DVs, checkpoints, sidecars, commits, _last_checkpoint: each open
    goes through TableStorage, where paths are held to the table root."""
    rel = str(path.relative_to(ROOT))
    if rel.startswith(OPEN_CHOKE_POINT):
        return
    assert opens_outside_storage(path.read_text(), rel) == []
    around = [
        m for m, _, _ in _imports(path, "deltamirror.core") if m.startswith("deltamirror.core.storage.local")
    ]
    assert around == [], f"{rel} imports {around[0]}, the opens behind TableStorage"


def test_the_open_checker_sees_every_way_around() -> None:
    planted = {
        "open(p)": "calls open",
        "import io\nio.open(p)": "io.open",
        "import os\nos.open(p, 0)": "os.open",
        "import pyarrow.parquet as pq\npq.read_table(p)": "pyarrow.parquet.read_table",
        "from pyarrow import parquet\nparquet.ParquetFile(p)": "pyarrow.parquet.ParquetFile",
        "from pyarrow.parquet import read_metadata as rm\nrm(p)": "pyarrow.parquet.read_metadata",
        "import pyarrow as pa\npa.memory_map(p)": "pyarrow.memory_map",
        "import pyarrow.fs as pafs\npafs.LocalFileSystem()": "pyarrow.fs",
        "from pathlib import Path\nPath(p).read_bytes()": "pathlib",
        "import fsspec\nfsspec.open(p)": "fsspec",
        "table.storage.fs.open(p)": "fs.open()",
        "fs.cat_file(p)": ".cat_file()",
        "handle.read_bytes(p)": "handle.read_bytes()",
    }
    for source, needle in planted.items():
        found = opens_outside_storage(source)
        assert any(needle in f for f in found), (source, found)
    allowed = "storage.open(p)\nself.table.storage.read_bytes(p)\nstorage.parquet_file(p)\n"
    assert opens_outside_storage(allowed) == []


def test_the_choke_point_itself_opens_files() -> None:
    """The exemption is not a blind spot: the storage package is where the opens the others may not do are."""
    found = [
        f
        for path in _files(OPEN_CHOKE_POINT)
        for f in opens_outside_storage(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert any("os.open" in f for f in found) and any("open_input_file" in f for f in found)


# --- the faces: each package's API is its __all__; README, docs and examples import nothing else ---

#: the packages whose ``__init__`` is a face (deltamirror itself holds __version__ only)
FACES = [PACKAGES[folder] for folder in PACKAGES]
#: the text a user copies: README.md, docs/*.md (their python code blocks) and examples/
USER_DOCS = ["README.md", "docs/*.md"]
_CODE_BLOCK = re.compile(r"^```(?:python|py|pycon)[^\n]*\n(.*?)^```", re.M | re.S)


def _face(package: str) -> list[str]:
    names = getattr(importlib.import_module(package), "__all__", None)
    assert isinstance(names, list), f"{package} has no __all__: its face must list its API"
    return names


@pytest.mark.parametrize("package", FACES)
def test_each_face_lists_its_api_and_every_name_is_there(package: str) -> None:
    names = _face(package)
    assert len(names) == len(set(names)), f"{package}.__all__ names a name twice"
    module = importlib.import_module(package)
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == [], f"{package}.__all__ lists {missing}, which it does not have"


def test_deltamirror_has_its_distribution_version() -> None:
    import deltamirror

    assert deltamirror.__version__ == importlib.metadata.version("deltamirror")


def _code_imports(code: str) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every import of deltamirror in ``code``."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "deltamirror"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "deltamirror":
            found.append((node.module or "", [a.name for a in node.names], node.lineno))
    return found


def _user_code() -> list[tuple[str, str]]:
    """(where, python code) of every code block of the user docs, and every example file."""
    out = []
    for pattern in USER_DOCS:
        for doc in sorted(ROOT.glob(pattern)):
            text = doc.read_text()
            for block in _CODE_BLOCK.finditer(text):
                line = text[: block.start()].count("\n") + 2
                out.append((f"{doc.relative_to(ROOT)}:{line}", block.group(1)))
    out += [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "examples").rglob("*.py"))]
    return out


def private_imports(where: str, code: str) -> list[str]:
    """The imports of ``code`` that reach past a face: a module, or a name no ``__all__`` lists."""
    bad = []
    for module, names, line in _code_imports(code):
        if module == "deltamirror":
            bad += [f"{where}+{line}: deltamirror.{n}" for n in names if n not in ("__version__", *PACKAGES)]
        elif module not in FACES:
            bad.append(f"{where}+{line}: {module} is not a face ({', '.join(FACES)})")
        else:
            exported = _face(module)
            bad += [f"{where}+{line}: {module}.{n} is not in its __all__" for n in names if n not in exported]
    return bad


def test_the_docs_import_only_what_a_face_exports() -> None:
    blocks = _user_code()
    assert sum("deltamirror" in code for _, code in blocks) >= 5, "the doc scan found no code to check"
    bad = [b for where, code in blocks for b in private_imports(where, code)]
    assert bad == [], "\n".join(bad)


def test_the_face_checker_sees_a_private_import() -> None:
    code = (
        "from deltamirror.producer.config_file import load_config\n"
        "from deltamirror.consumer import register, SnapshotConsumer\n"
        "from deltamirror.mirror import EnvelopeEncoder\n"
        "import deltamirror.mirror.records.events\n"
    )
    bad = private_imports("planted", code)
    assert len(bad) == 3 and "config_file" in bad[0] and "EnvelopeEncoder" in bad[1], bad
    assert "records.events" in bad[2]
    text = "intro\n```python\nfrom deltamirror.core import open_table\n```\n"
    assert [b.group(1) for b in _CODE_BLOCK.finditer(text)] == ["from deltamirror.core import open_table\n"]


# --- the rooms: a small declared graph inside each package --------------------------------------

#: per package, the rooms (a sub-package ``name/`` or a module ``name.py`` at the package's top) and
#: the rooms each may import; ``"*"`` lists the leaves every room may import (they import no room).
#: The face (``__init__.py``) may import any room; no room imports its own package's face.
ROOMS: dict[str, dict[str, set[str]]] = {
    "mirror": {
        "*": {"errors.py"},
        "records/": set(),  # the records: encoders, decoders, headers, fragments, formats, the boundary
        "kafka/": {"records/"},  # the typed confluent-kafka clients and the one read loop
        "settings.py": {"kafka/"},
        "topic_names.py": set(),  # the names: pure, no client (the consumers' settings check them)
        "topics.py": {"kafka/"},
        "group.py": {"kafka/", "topics.py", "topic_names.py"},
    },
    "producer": {
        "*": {"settings.py", "metrics.py"},
        "discovery/": set(),  # tables found under a prefix, signals, topic claims, the start check
        "tailing/": {"discovery/"},  # one table's log: watcher, work, wakers, retention
        "group/": set(),  # the group's membership, the shards' producers
        "publishing/": {"tailing/", "group/"},  # records, transactions, progress, sessions
        "pipeline.py": {"tailing/", "publishing/", "group/", "discovery/"},
        "scheduler.py": set(),  # the workers that serve every table (it runs pipelines, imports none)
        "service.py": {
            "pipeline.py",
            "scheduler.py",
            "collector.py",
            "publishing/",
            "group/",
            "discovery/",
            "config_file.py",
            "liveness.py",
            "log_format.py",
        },
        "config_file.py": set(),
        "collector.py": set(),  # the cyclic collector's old generation frozen as tables are added
        "liveness.py": set(),
        "log_format.py": set(),
    },
    "consumer": {
        "*": {"metrics.py", "settings.py"},
        "snapshot/": set(),
        "invalidate/": {"snapshot/"},
        "bad_records.py": {"invalidate/"},
        "mirror_changes.py": set(),
        "spark/": {"mirror_changes.py"},
    },
    "devkafka": {
        "*": set(),
        "jars.py": set(),
        "security.py": set(),
        "processes.py": {"jars.py"},
        "broker.py": {"jars.py", "security.py", "processes.py"},
        "tools.py": {"jars.py"},
        "registry.py": {"jars.py", "processes.py", "security.py"},  # the 0600 secret files, as the broker
    },
    "ops": {"*": set(), "server.py": set(), "stopping.py": set()},
    # core's rooms are its modules; declared here: storage/, the one choke point, stands below them
    "core": {
        "*": {"errors.py", "paths.py", "redact.py", "compute.py"},
        "compute.py": set(),  # pyarrow.compute, imported on first use
        "errors.py": {"redact.py"},
        "paths.py": {"errors.py", "compute.py"},
        "redact.py": set(),
        "storage/": set(),
    },
}


def _room(folder: str, module: str) -> str | None:
    """The room of ``module`` (absolute) in package ``folder``: None for the face."""
    parts = module.split(".")[2:]
    if not parts:
        return None
    return f"{parts[0]}/" if (ROOT / folder / parts[0]).is_dir() else f"{parts[0]}.py"


def _targets(path: Path, package: str) -> list[tuple[str, int]]:
    """The modules ``path`` imports (any import: at import time, in functions, for the type checker);
    ``from package import module`` counts as the module, not the package."""
    rel_parts = path.relative_to(ROOT).with_suffix("").parts
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = [*package.split("."), *rel_parts[1:-1]]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, node.module] if node.module else parts)
            for a in node.names:
                sub = ROOT.joinpath(*base.split(".")[1:], a.name)
                is_module = sub.with_suffix(".py").exists() or sub.is_dir()
                out.append((f"{base}.{a.name}" if is_module else base, node.lineno))
    return out


def room_edges(folder: str) -> set[tuple[str, str, str]]:
    """(room, imported room, where) for every import between two rooms of one package."""
    package = PACKAGES[folder]
    edges = set()
    for path in _files(folder):
        rel = path.relative_to(ROOT / folder)
        if rel == Path("__init__.py"):
            continue
        here = f"{rel.parts[0]}/" if len(rel.parts) > 1 else rel.name
        for module, line in _targets(path, package):
            if not module.startswith(f"{package}.") and module != package:
                continue
            there = _room(folder, module)
            if there != here:
                edges.add((here, there or "__init__.py", f"{folder}/{rel}:{line}"))
    return edges


@pytest.mark.parametrize("folder", sorted(ROOMS))
def test_the_rooms_import_only_what_is_declared(folder: str) -> None:
    declared = ROOMS[folder]
    leaves = declared["*"]
    bad = []
    for here, there, where in sorted(room_edges(folder)):
        if there == "__init__.py":
            bad.append(f"{where}: {here} imports its package's face")
        elif folder == "core" and here not in declared and here not in leaves:
            continue  # core declares only its choke point: storage/ imports no other room
        elif here not in declared and here not in leaves:
            bad.append(f"{where}: {here} is not a declared room of {folder} (add it to ROOMS)")
        elif there not in declared.get(here, set()) and (there not in leaves or here in leaves):
            bad.append(f"{where}: {here} may not import {there} (ROOMS[{folder!r}])")
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("folder", sorted(ROOMS))
def test_the_declared_rooms_have_no_cycle(folder: str) -> None:
    graph = {room: set(allowed) for room, allowed in ROOMS[folder].items() if room != "*"}
    for leaf in ROOMS[folder]["*"]:
        graph.setdefault(leaf, set())
        for room in graph:
            if room not in ROOMS[folder]["*"]:
                graph[room].add(leaf)
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_room_checker_sees_an_undeclared_import(tmp_path: Path) -> None:
    """A planted import from the group back to publishing is an edge the declaration does not allow."""
    planted = tmp_path / "producer" / "group" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        "from ..publishing import transactions\nfrom deltamirror.producer import WatchService\n"
    )
    for room in ("publishing", "tailing"):
        (tmp_path / "producer" / room).mkdir()
        (tmp_path / "producer" / room / "transactions.py").write_text("")
    with _rooted_at(tmp_path):
        edges = {(here, there) for here, there, _ in room_edges("producer")}
    assert ("group/", "publishing/") in edges and ("group/", "__init__.py") in edges
    assert "publishing/" not in ROOMS["producer"]["group/"]
