"""A tailer's start (core/head.py): the head it starts from is feature-checked by core, not by the tailer."""

from __future__ import annotations

import pytest

from deltamirror.core.errors import UnsupportedFeatureError
from deltamirror.core.head import read_head
from deltamirror.core.table import open_table
from support.tables import TABLES

GEO = TABLES / "krs__table-with-geo"


def test_a_head_of_an_unreadable_table_is_refused_by_the_feature_s_name() -> None:
    table = open_table(str(GEO))
    latest = table.latest_version()
    with pytest.raises(UnsupportedFeatureError) as info:
        read_head(table, latest)
    assert (
        info.value.feature == "geospatial" and info.value.version == latest and info.value.table == table.uri
    )


def test_an_unchecked_head_is_checked_later_by_the_same_rule() -> None:
    table = open_table(str(GEO))
    head = read_head(table, table.latest_version(), check_features=False)  # its id and settings are readable
    assert head.metadata.id and head.table == table.uri
    with pytest.raises(UnsupportedFeatureError) as info:
        head.check_readable()
    assert info.value.feature == "geospatial"


def test_a_readable_head_is_returned_as_read() -> None:
    table = open_table(str(TABLES / "drs__simple_table"))
    head = read_head(table, 0)
    assert head.check_readable() is head and head.version == 0


@pytest.mark.parametrize("name", ["drs__simple_table", "drs__cdc_ict_table"])
def test_a_head_read_at_the_latest_version_serves_its_timestamp_without_reading_the_log_again(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table started at its latest version reads its head, then its timestamp: one replay of the
    log's metaData, and the same timestamp a fresh table gives."""
    import deltamirror.core.head as head_module
    import deltamirror.core.table as table_module

    table = open_table(str(TABLES / name))
    latest = table.latest_version()
    replays: list[int] = []
    for module in (head_module, table_module):
        real = module.replay_config
        monkeypatch.setattr(
            module,
            "replay_config",
            lambda storage, segment, real=real: replays.append(segment.version) or real(storage, segment),
        )
    read_head(table, latest)
    stamp = table.commit_timestamp(latest)
    assert replays == [latest]
    monkeypatch.undo()
    assert stamp == open_table(str(TABLES / name)).commit_timestamp(latest)


@pytest.mark.parametrize("name", ["drs__simple_table", "drs__cdc_ict_table", "krs__table-with-geo"])
def test_the_latest_head_and_its_timestamp_come_from_one_listing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a start at the latest version asks (the version, its head, its timestamp), from one
    listing of the log, is what asking each in turn gives: the same head, time and refusal."""
    import deltamirror.core.log as log_module
    import deltamirror.core.table as table_module
    from deltamirror.core.head import read_latest_head

    table = open_table(str(TABLES / name))
    latest = table.latest_version()
    try:
        expected: object = (read_head(table, latest), table.commit_timestamp(latest))
    except UnsupportedFeatureError as exc:
        expected = (type(exc), exc.feature, exc.version)
    listings: list[int] = []
    for module in (log_module, table_module):
        real = module.list_log
        monkeypatch.setattr(
            module,
            "list_log",
            lambda storage, start=0, real=real: listings.append(start) or real(storage, start),
        )
    fresh = open_table(str(TABLES / name))
    try:
        got: object = read_latest_head(fresh)
    except UnsupportedFeatureError as exc:
        got = (type(exc), exc.feature, exc.version)
    assert got == expected
    assert listings == [0]
