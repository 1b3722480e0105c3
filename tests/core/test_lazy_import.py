"""Importing the package is cheap: pyarrow, pydantic and fsspec load on first use of a name."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pyarrow", "pydantic", "fsspec")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return set(out.split())


def test_importing_the_package_loads_no_heavy_module() -> None:
    loaded = _modules_after("import deltamirror.core")
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}
    assert "deltamirror.core.errors" in loaded  # the root error is at hand without a load


def test_a_name_of_the_api_loads_its_module_on_first_use() -> None:
    loaded = _modules_after("from deltamirror.core import open_table\nassert callable(open_table)")
    assert {"deltamirror.core.table", "pyarrow"} <= loaded


def test_an_unknown_name_is_an_attribute_error() -> None:
    import deltamirror.core as core

    try:
        core.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")
    assert "open_table" in dir(core)


def test_reading_a_local_table_never_loads_fsspec() -> None:
    """fsspec (and the asyncio it loads) is for object stores: a local table's snapshot, history,
    change feed and commit times are read without it (a consumer's restart pays no import for it)."""
    from support.tables import TABLES

    path = TABLES / "drs__simple_table_with_cdc"
    loaded = _modules_after(
        "from deltamirror.core import open_table\n"
        f"t = open_table({str(path)!r})\n"
        "t.snapshot().to_arrow(); t.history(); t.changes(starting_version=0).to_arrow()\n"
        "import deltamirror.cli.main, deltamirror.consumer.snapshot"
    )
    assert "deltamirror.core.table" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("fsspec", "asyncio")}
