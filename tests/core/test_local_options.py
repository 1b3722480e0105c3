"""Storage options on a local table are refused in one line (exit 2): a local table is read with
the operating system's files, which take no option, so any given would be silently ignored.

The library, every table command's ``-S`` and the watcher's settings (a table, a discover prefix)
refuse them alike, naming the option keys (never their values); an object store takes them.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltamirror.cli.main import main
from deltamirror.core import open_table
from deltamirror.core.errors import ConfigError, InvalidArgumentError

SECRET = "s3cr3t-Local-0042"


@pytest.fixture
def table(tmp_path: Path) -> Path:
    write_deltalake(str(tmp_path / "t"), pa.table({"x": [1, 2]}))
    return tmp_path / "t"


@pytest.mark.parametrize("form", ["path", "file-uri"])
def test_the_library_refuses_storage_options_on_a_local_table(table: Path, form: str) -> None:
    location = str(table) if form == "path" else table.as_uri()
    with pytest.raises(InvalidArgumentError) as err:
        open_table(location, {"aws_secret_access_key": SECRET, "region": "eu"})
    message = str(err.value)
    assert "storage options" in message and "aws_secret_access_key, region" in message
    assert SECRET not in message
    assert open_table(location, {}).latest_version() == 0  # none given: read as always


@pytest.mark.parametrize("command", ["snapshot", "read", "history", "changes", "events"])
def test_every_table_command_refuses_dash_s_on_a_local_table(
    table: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    start = ["--starting-version", "0"] if command == "changes" else []
    assert main([command, str(table), *start, "-S", f"password={SECRET}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "storage options (-S, storage_options) have no effect on a local table (password)" in err
    assert SECRET not in err


def test_watch_settings_refuse_storage_options_on_a_local_table_or_prefix(tmp_path: Path) -> None:
    from deltamirror.producer.settings import merge_overrides

    base = {"bootstrap_servers": "k:9092", "storage_options": {"key": SECRET}}
    for where in ({"tables": [str(tmp_path / "t")]}, {"discover": [str(tmp_path)]}):
        with pytest.raises(
            ConfigError, match=r"storage_options: storage options .* local table \(key\)"
        ) as err:
            merge_overrides(None, {**base, **where})
        assert SECRET not in str(err.value)
    cfg = merge_overrides(None, {**base, "tables": ["s3://bucket/t"], "discover": ["s3://bucket/lake/"]})
    assert cfg.tables[0].storage_options_plain() == {"key": SECRET}
    assert cfg.discover[0].storage_options_plain() == {"key": SECRET}
