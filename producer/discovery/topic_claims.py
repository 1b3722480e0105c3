"""Which table publishes to which topic: the one check that two tables never write a topic by accident.

The service refuses a table whose topics another of its tables has, and discovery refuses a table
it found before handing it over (saying once why, with a hint of its own); both hold a
:class:`TopicClaims` so that the rule is written once.

Every topic a table publishes to is claimed: actions and commits, and changes and transaction with
row changes on (names from :meth:`TableConfig.topics`). Two tables may share a topic that the
table being added names in its settings (actions, commits and transaction records carry the
table), but never a changes topic: its records are keyed by the row's key alone, so the tables'
rows would mix, and on a compacted topic a delete's tombstone in one would remove the other's row.

A discover prefix's shared topics (``topics: shared``) belong to the prefix: every table found under
it publishes to them, and no other table may (the settings refuse a configured table or another
prefix naming them; this refuses a discovered table of another prefix whose topics would be them).
They are not claimed table by table, so one table of the prefix dropped frees nothing.
"""

from __future__ import annotations

from deltamirror.core.errors import ConfigError

from ..settings import TableConfig

#: the settings that rename a kind of topic, for the refusal's hint
_RENAMED_BY = {
    "actions": "actions_topic and commits_topic",
    "commits": "actions_topic and commits_topic",
    "changes": "changes_topic and transaction_topic",
    "transaction": "changes_topic and transaction_topic",
}


def published_topics(table: TableConfig) -> dict[str, str]:
    """Every topic ``table`` publishes to, by kind (changes and transaction with row changes on)."""
    topics = table.topics()
    published = {"actions": topics.actions, "commits": topics.commits}
    if table.row_changes_on:
        published |= {"changes": topics.changes, "transaction": topics.transaction}
    return published


class TopicClaims:
    """Topic name -> the table (normalized URI) publishing to it, and as what kind of topic.

    Not thread-safe: the service calls it under its lock, discovery from its one thread.
    """

    def __init__(self, shared: dict[str, str] | None = None) -> None:
        self._owners: dict[str, tuple[str, str]] = {}
        #: shared topic -> the normalized location of the discover prefix whose tables publish to it
        self._shared = dict(shared or {})

    def check(self, table: TableConfig, *, hint: str | None = None) -> None:
        """Raise a one-line ConfigError if ``table`` would publish to another table's topic.

        ``hint`` says how to fix it (default: the settings that rename the topic).
        """
        uri = table.normalized_uri
        for kind, name in published_topics(table).items():
            prefix = self._shared.get(name)
            if prefix is not None:
                if not uri.startswith(prefix.rstrip("/") + "/"):
                    raise ConfigError(
                        f"table {uri} would publish to {name}, the shared topic of the tables under "
                        f"{prefix}: {hint or f'set {_RENAMED_BY[kind]} for it'}",
                        table=table.uri,
                    )
                continue
            owner = self._owners.get(name)
            if owner is None or owner[0] == uri:
                continue
            other, other_kind = owner
            configured = getattr(table, f"{kind}_topic") is not None
            fix = hint or f"set {_RENAMED_BY[kind]} for one of them"
            if not configured:
                raise ConfigError(
                    f"tables {other} and {uri} would share the default {kind} topic {name}: {fix}",
                    table=table.uri,
                )
            if "changes" in (kind, other_kind):  # named in the settings, but still one topic of rows
                what = "the changes topic" if kind == other_kind else "the topic"
                raise ConfigError(
                    f"tables {other} and {uri} would share {what} {name}, whose records are keyed by "
                    f"the row alone: {fix}",
                    table=table.uri,
                )

    def claim(self, table: TableConfig) -> None:
        """Record ``table``'s topics as taken (after :meth:`check`, or for a table known valid)."""
        for kind, name in published_topics(table).items():
            if name not in self._shared:
                self._owners[name] = (table.normalized_uri, kind)

    def admit(self, table: TableConfig, *, hint: str | None = None) -> None:
        """:meth:`check`, then :meth:`claim`."""
        self.check(table, hint=hint)
        self.claim(table)

    def release(self, normalized_uri: str) -> None:
        """The table is gone: its topics are free."""
        for name in [n for n, (uri, _) in self._owners.items() if uri == normalized_uri]:
            del self._owners[name]


__all__ = ["TopicClaims", "published_topics"]
