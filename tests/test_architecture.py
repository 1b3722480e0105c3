"""The import rules of the design, checked on the source: core is the protocol and nothing else.

- core imports only the standard library, pyarrow, fsspec and pydantic;
- producer and consumer import core, never each other;
- only consumer/spark_source.py imports pyspark;
- the CLI imports core/producer/consumer only inside functions (lazily), except its own modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "core": "deltamirror.core",
    "producer": "deltamirror.producer",
    "consumer": "deltamirror.consumer",
    "cli": "deltamirror.cli",
}
CORE_ALLOWED = {"pyarrow", "fsspec", "pydantic", "pydantic_core"}
SPARK_MODULES = {"consumer/spark_source.py"}


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
                base = [package, *rel_parts[1:-1]]
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


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module == "__future__"


@pytest.mark.parametrize("path", _files("core"), ids=lambda p: p.name)
def test_core_imports_only_stdlib_pyarrow_fsspec_pydantic(path: Path) -> None:
    for module, line, _ in _imports(path, "deltamirror.core"):
        top = module.split(".")[0]
        ok = _is_stdlib(module) or top in CORE_ALLOWED or module.startswith("deltamirror.core")
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
            if module.startswith(("deltamirror.producer", "deltamirror.consumer", "deltamirror.core")):
                assert not top_level, f"{path.relative_to(ROOT)}:{line} imports {module} at module level"


def test_the_rule_checker_sees_a_violation(tmp_path: Path) -> None:
    """The checks above can fail: a planted bad import is found."""
    bad = ROOT / "core" / "_planted_violation_for_test.py"
    bad.write_text("import confluent_kafka\n")
    try:
        found = [m for m, _, _ in _imports(bad, "deltamirror.core")]
        assert "confluent_kafka" in found
        assert not (_is_stdlib("confluent_kafka") or "confluent_kafka" in CORE_ALLOWED)
    finally:
        bad.unlink()


def test_the_wire_format_lives_in_one_module() -> None:
    """Envelope field names appear only in core/events.py; everyone else goes through it."""
    owners = set()
    for folder in PACKAGES:
        for path in _files(folder):
            text = path.read_text()
            if '"schemaVersion"' in text or '"commitTimestampSource"' in text:
                owners.add(str(path.relative_to(ROOT)))
    assert owners == {"core/events.py"}
