"""The action accumulator's public API, as a consumer outside core uses it.

Expected values are written from PROTOCOL.md's rules (newest metaData/protocol/txn wins, a
removed domain is gone, the first commitInfo of a version is its own), not from the code.
"""

from __future__ import annotations

import pytest

from deltamirror.core.accumulator import FILE_ROWS, ORDER, ActionAccumulator
from deltamirror.core.action_schema import ADD, REMOVE
from deltamirror.core.errors import CorruptLogError
from deltamirror.core.models import DomainMetadata, Txn
from deltamirror.core.replay import reconcile

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'


def _meta(table_id: str) -> dict[str, object]:
    return {"id": table_id, "format": {"provider": "parquet"}, "schemaString": SCHEMA, "partitionColumns": []}


def _add(path: str) -> dict[str, object]:
    return {"path": path, "partitionValues": {}, "size": 1, "modificationTime": 1, "dataChange": True}


def test_newest_state_actions_win_and_the_first_commit_info_is_kept() -> None:
    acc = ActionAccumulator()
    acc.take(1, "metaData", _meta("a"))
    acc.take(1, "protocol", {"minReaderVersion": 1, "minWriterVersion": 2})
    acc.take(1, "commitInfo", {"operation": "WRITE"})
    acc.take(1, "commitInfo", {"operation": "OTHER"})
    acc.take(2, "metaData", _meta("b"))
    acc.take(
        2,
        "protocol",
        {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [], "writerFeatures": []},
    )
    acc.take(2, "txn", {"appId": "app", "version": 1})
    acc.take(3, "txn", {"appId": "app", "version": 5})
    acc.take(3, "cdc", {"path": "c.parquet", "partitionValues": {}, "size": 1, "dataChange": False})
    acc.take(3, "someFutureAction", {"x": 1})
    acc.take(3, "someFutureAction", {"x": 2})
    assert acc.metadata is not None and acc.metadata.id == "b"
    assert acc.protocol is not None and acc.protocol.min_reader_version == 3
    assert {v: c.operation for v, c in acc.commit_infos.items()} == {1: "WRITE"}
    assert acc.txns["app"].version == 5
    assert acc.unknown == {"someFutureAction": 2}


def test_txns_and_domains_apply_over_an_earlier_state() -> None:
    acc = ActionAccumulator()
    acc.take(4, "domainMetadata", {"domain": "gone", "configuration": "{}", "removed": True})
    acc.take(4, "domainMetadata", {"domain": "new", "configuration": "{}", "removed": False})
    acc.take(4, "txn", {"appId": "b", "version": 9})
    base_domains = {
        "gone": DomainMetadata(domain="gone", configuration="{}"),
        "kept": DomainMetadata(domain="kept", configuration="{}"),
    }
    base_txns = {"a": Txn(app_id="a", version=1), "b": Txn(app_id="b", version=2)}
    assert sorted(acc.domains_over(base_domains)) == ["kept", "new"]
    assert {k: t.version for k, t in acc.txns_over(base_txns).items()} == {"a": 1, "b": 9}
    assert base_domains.keys() == {"gone", "kept"}  # the earlier state is not changed


@pytest.mark.parametrize("batch_rows", [None, 1, 2, 100])
def test_file_actions_keep_their_place_in_the_log(batch_rows: int | None) -> None:
    acc = ActionAccumulator(batch_rows=batch_rows)
    acc.take_files("add", [_add("a"), _add("b")], first_order=1)
    acc.take_files("remove", [{"path": "a", "dataChange": True}], first_order=3)
    acc.take_files("add", [_add("a")], first_order=7)
    adds, removes = acc.file_actions()
    assert adds.schema == FILE_ROWS["add"] and removes.schema == FILE_ROWS["remove"]
    assert adds.column("path").to_pylist() == ["a", "b", "a"]
    assert adds.column(ORDER).to_pylist() == [1, 2, 7]
    assert removes.column(ORDER).to_pylist() == [3]
    files, tombstones = reconcile(ADD.empty_table(), REMOVE.empty_table(), adds, removes)
    assert sorted(files.column("path").to_pylist()) == ["a", "b"]  # re-added after its remove
    assert tombstones.num_rows == 0


def test_nothing_taken_gives_empty_tables() -> None:
    adds, removes = ActionAccumulator().file_actions()
    assert (adds.num_rows, removes.num_rows) == (0, 0)
    assert adds.schema == FILE_ROWS["add"]


def test_a_body_that_fits_no_model_is_a_corrupt_log_not_a_traceback() -> None:
    acc = ActionAccumulator(table="file:///t")
    with pytest.raises(CorruptLogError):
        acc.take(0, "txn", {"appId": "a", "version": "not a number"})
    with pytest.raises(CorruptLogError):
        acc.take_files("add", [{"path": 5, "size": "x"}], first_order=0)
        acc.file_actions()
