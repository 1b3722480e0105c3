"""Snapshots, rows and the change feed of tables on S3, through s3fs against a real S3-API server.

Each table is uploaded from ``tests/data/tables`` and read twice, from the server and from the local
copy: the results must be equal (the local reads are checked against Spark elsewhere). The storage
options (endpoint, key, secret) travel as the table's ``storage_options``, as a user gives them.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pyarrow as pa
import pytest

from deltamirror.core import open_table
from deltamirror.core.errors import DeltaMirrorError
from support.s3proxy import S3Proxy

pytestmark = [pytest.mark.s3]

TABLES = Path(__file__).resolve().parents[1] / "data" / "tables"

# a v2 checkpoint, a v2 checkpoint with sidecars, deletion vectors over a checkpoint, partition values that need
# URL-encoding in object keys (``x=A%2FA``, ``x=B%20B``), and the change feed with _change_data files
SNAPSHOT_TABLES = [
    "drs__checkpoint-v2-table",
    "krs__v2-checkpoints-json-with-sidecars",
    "golden__dv-partitioned-with-checkpoint",
    "drs__delta-0.8.0-special-partition",
    "krs__cdf-table",
]


def _sorted(table: pa.Table) -> pa.Table:
    keys = [
        (name, "ascending")
        for name in table.column_names
        if not pa.types.is_nested(table.schema.field(name).type)
    ]
    return table.sort_by(keys)


@pytest.fixture(scope="module")
def uploaded(s3: S3Proxy) -> dict[str, str]:
    """Every table this module reads, uploaded once: local name -> s3 URL."""
    prefix = s3.new_prefix("core")
    return {name: s3.upload_table(TABLES / name, f"{prefix}/{name}") for name in SNAPSHOT_TABLES}


@pytest.mark.parametrize("name", SNAPSHOT_TABLES)
def test_a_snapshot_and_its_rows_on_s3_equal_the_local_ones(
    s3: S3Proxy, uploaded: dict[str, str], name: str
) -> None:
    remote = open_table(uploaded[name], s3.storage_options)
    local = open_table(str(TABLES / name))
    assert remote.latest_version() == local.latest_version()
    remote_snap, local_snap = remote.snapshot(), local.snapshot()
    assert remote_snap.version == local_snap.version
    assert remote_snap.metadata == local_snap.metadata
    assert remote_snap.protocol == local_snap.protocol
    paths = remote_snap.files.column("path").to_pylist()
    assert sorted(paths) == sorted(local_snap.files.column("path").to_pylist())
    assert paths, "a table without files proves nothing here"
    rows = remote_snap.to_arrow()
    assert rows.num_rows > 0
    assert _sorted(rows).equals(_sorted(local_snap.to_arrow()))


def test_time_travel_on_s3_equals_the_local_one(s3: S3Proxy, uploaded: dict[str, str]) -> None:
    name = "drs__checkpoint-v2-table"
    remote = open_table(uploaded[name], s3.storage_options)
    local = open_table(str(TABLES / name))
    for version in range(local.latest_version() + 1):
        assert _sorted(remote.snapshot(version).to_arrow()).equals(
            _sorted(local.snapshot(version).to_arrow())
        )


@pytest.mark.parametrize(("start", "end"), [(0, None), (1, 2)])
def test_the_change_feed_on_s3_equals_the_local_one(
    s3: S3Proxy, uploaded: dict[str, str], start: int, end: int | None
) -> None:
    name = "krs__cdf-table"
    remote = open_table(uploaded[name], s3.storage_options).changes(
        starting_version=start, ending_version=end
    )
    local = open_table(str(TABLES / name)).changes(starting_version=start, ending_version=end)
    got, want = remote.to_arrow(), local.to_arrow()
    assert got.num_rows > 0
    assert got.schema == want.schema
    # without in-commit timestamps a commit's time is its file's: the upload's, not the local copy's
    times = got.select(["_commit_version", "_commit_timestamp"]).sort_by("_commit_version")
    stamps = times.column("_commit_timestamp").to_pylist()
    assert None not in stamps and stamps == sorted(stamps)
    ts = "_commit_timestamp"
    assert _sorted(got.drop_columns([ts])).equals(_sorted(want.drop_columns([ts])))


def test_history_on_s3_reads_the_object_times(s3: S3Proxy, uploaded: dict[str, str]) -> None:
    name = "krs__cdf-table"
    entries = list(open_table(uploaded[name], s3.storage_options).history())
    local = list(open_table(str(TABLES / name)).history())
    assert [e.version for e in entries] == [e.version for e in local]
    assert [e.operation for e in entries] == [e.operation for e in local]


def test_a_wrong_secret_fails_in_one_line_without_the_secret(s3: S3Proxy, uploaded: dict[str, str]) -> None:
    wrong = "wrong-secret-Zz99" + s3.secret[:4]
    options = {**s3.storage_options, "secret": wrong}
    with pytest.raises(DeltaMirrorError) as info:
        open_table(uploaded["krs__cdf-table"], options).snapshot()
    text = f"{info.value}\n{info.value!r}"
    assert "\n" not in str(info.value)
    assert wrong not in text and s3.secret not in text
    assert info.value.exit_code in (1, 2)


def test_a_missing_table_on_s3_is_reported_as_missing(s3: S3Proxy) -> None:
    from deltamirror.core.errors import TableNotFoundError

    with pytest.raises(TableNotFoundError):
        open_table(s3.url(s3.new_prefix("nothing-here")), s3.storage_options).latest_version()


def test_an_unreachable_endpoint_is_a_retryable_storage_error_in_one_line(s3: S3Proxy) -> None:
    from deltamirror.core.errors import StorageError
    from deltamirror.core.storage import TableStorage

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    options = {
        **s3.storage_options,
        "endpoint_url": f"http://127.0.0.1:{closed}",
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    storage = TableStorage(s3.url("anywhere/t"), options, attempts=2, backoff_s=0.0)
    with pytest.raises(StorageError) as info:
        storage.read_bytes(storage.log_file("00000000000000000000.json"))
    assert info.value.exit_code == 1  # retryable: the watcher tries again, the CLI says so
    assert "EndpointConnectionError" in str(info.value) and "\n" not in str(info.value)
    assert s3.secret not in f"{info.value}{info.value!r}"
