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
