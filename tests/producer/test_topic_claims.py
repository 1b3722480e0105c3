"""Two tables never publish to one topic by accident: every topic a table publishes to is checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltamirror.core.errors import ConfigError
from deltamirror.producer.discovery.topic_claims import TopicClaims, published_topics
from deltamirror.producer.pipeline import table_topics
from deltamirror.producer.service import WatchService
from deltamirror.producer.settings import TableConfig, WatchConfig


def _cfg(*tables: dict[str, Any]) -> WatchConfig:
    return WatchConfig.model_validate({"kafka": {"bootstrap_servers": "localhost:1"}, "tables": list(tables)})


def test_two_tables_with_one_configured_changes_topic_are_refused(tmp_path: Path) -> None:
    cfg = _cfg(
        {"uri": str(tmp_path / "a"), "row_changes": {}, "changes_topic": "shop.changes"},
        {"uri": str(tmp_path / "b"), "row_changes": {}, "changes_topic": "shop.changes"},
    )
    with pytest.raises(ConfigError) as err:
        WatchService(cfg)  # refused on admission, before any table is opened or broker asked
    assert err.value.message == (
        f"tables file://{tmp_path}/a and file://{tmp_path}/b would share the changes topic shop.changes, "
        "whose records are keyed by the row alone: set changes_topic and transaction_topic for one of them"
    )


def test_default_changes_topics_clash_even_when_the_event_topics_are_named(tmp_path: Path) -> None:
    # the same directory name: the default changes topics are one, though actions and commits differ
    a = {"uri": str(tmp_path / "x" / "orders"), "row_changes": {}}
    b = {
        "uri": str(tmp_path / "y" / "orders"),
        "row_changes": {},
        "actions_topic": "b.a",
        "commits_topic": "b.c",
    }
    with pytest.raises(
        ConfigError, match=r"would share the default changes topic deltamirror\.orders\.changes"
    ):
        WatchService(_cfg(a, b))
    claims = TopicClaims()  # without row changes they publish to no common topic
    claims.admit(TableConfig.model_validate({**a, "row_changes": None}))
    claims.admit(TableConfig.model_validate({**b, "row_changes": None}))


def test_default_event_topics_clash_and_named_ones_may_be_shared(tmp_path: Path) -> None:
    a = TableConfig(uri=str(tmp_path / "x" / "orders"))
    claims = TopicClaims()
    claims.admit(a)
    with pytest.raises(ConfigError) as err:
        claims.admit(TableConfig(uri=str(tmp_path / "y" / "orders")))
    assert err.value.message == (
        f"tables file://{tmp_path}/x/orders and file://{tmp_path}/y/orders would share the default actions "
        "topic deltamirror.orders.actions: set actions_topic and commits_topic for one of them"
    )
    # a table naming another's event topics in its settings shares them (their records carry the table)
    claims.admit(
        TableConfig(
            uri=str(tmp_path / "z"),
            actions_topic="deltamirror.orders.actions",
            commits_topic="deltamirror.orders.commits",
        )
    )
    claims.release(a.normalized_uri)
    claims.release(f"file://{tmp_path}/z")
    claims.admit(TableConfig(uri=str(tmp_path / "y" / "orders")))  # free again


def test_a_changes_topic_is_never_shared_even_by_name(tmp_path: Path) -> None:
    claims = TopicClaims()
    claims.admit(TableConfig(uri=str(tmp_path / "a"), row_changes={}, changes_topic="shop.rows"))
    named = TableConfig(uri=str(tmp_path / "b"), actions_topic="shop.rows", commits_topic="b.commits")
    with pytest.raises(
        ConfigError, match=r"would share the topic shop\.rows, whose records are keyed by the row"
    ):
        claims.check(named, hint="rename it")


def test_one_source_of_topic_names(tmp_path: Path) -> None:
    table = TableConfig(
        uri=str(tmp_path / "orders"), row_changes={}, commits_topic="c", transaction_topic="t"
    )
    assert table_topics(table) == table.topics()
    assert published_topics(table) == {
        "actions": "deltamirror.orders.actions",
        "commits": "c",
        "changes": "deltamirror.orders.changes",
        "transaction": "t",
    }
    assert published_topics(TableConfig(uri=str(tmp_path / "orders"))) == {
        "actions": "deltamirror.orders.actions",
        "commits": "deltamirror.orders.commits",
    }
