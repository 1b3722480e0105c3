"""The topics' names: which names Kafka takes, and the names deltamirror gives when it is given none.

The watcher names the topics of a table it was given no names for; a consumer told only the
actions topic needs the matching commits topic (it carries ``tableReplaced``); every command that
takes a topic by name checks it by the same rule. Both sides must agree without the consumer
importing the producer, so the rules live here, once (the architecture test holds every other
module to them). Pure: no Kafka client is imported (the consumers' settings check names at start).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from deltamirror.core.errors import ConfigError

PREFIX = "deltamirror."
ACTIONS_SUFFIX = ".actions"
COMMITS_SUFFIX = ".commits"
CHANGES_SUFFIX = ".changes"
TRANSACTION_SUFFIX = ".transaction"
SHARDS_SUFFIX = ".shards"
#: the watchers' progress topic when none is configured
PROGRESS_TOPIC = "deltamirror.progress"
#: the watchers' signal topic when none is configured
SIGNAL_TOPIC = "deltamirror.signals"

#: longest ``<name>`` of a table's default topics: ``deltamirror.<name>.transaction`` must stay
#: within Kafka's 249 characters
MAX_NAME = 200
#: a ``<name>`` given in the settings (a table's ``topic_name``, a group's ``name``)
NAME_PATTERN = r"^[A-Za-z0-9._-]{1,200}$"
#: a discover prefix's ``name`` (put before each discovered table's): no leading ``.``
PREFIX_NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$"

#: a name Kafka accepts (and "." / ".." are not)
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
TOPIC_NAME_RULE = "invalid Kafka topic name: 1 to 249 characters among letters, digits, '.', '_', '-'"
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_CLEAN_SEGMENT = re.compile(r"^[A-Za-z0-9_-]+$")
_UNSAFE_CHAR = re.compile(r"[^A-Za-z0-9._-]")


def topic_name_problem(name: str) -> str | None:
    """Why Kafka would refuse ``name`` as a topic (None: it takes it)."""
    if not _TOPIC_NAME.match(name) or name in (".", ".."):
        return TOPIC_NAME_RULE
    return None


def checked_topic_name(name: str | None) -> str | None:
    """``name`` as it is when Kafka takes it (None stays None); a ValueError saying the rule otherwise."""
    if name is not None:
        problem = topic_name_problem(name)
        if problem is not None:
            raise ValueError(problem)
    return name


@dataclass(frozen=True)
class TableTopics:
    actions: str
    commits: str
    #: row-level change events (published only when row changes are on)
    changes: str = ""
    #: their transaction metadata (BEGIN/END per version)
    transaction: str = ""


def table_name(table_uri: str, name: str | None = None) -> str:
    """The table's name for people: ``name`` when it has one (a discovered table's path, or the
    configured ``topic_name``), else the last path segment of its location ("table" for none)."""
    return name or table_uri.rstrip("/").rsplit("/", 1)[-1] or "table"


def default_topics(table_uri: str, *, name: str | None = None) -> TableTopics:
    """``deltamirror.<last path segment>.actions`` / ``.commits`` (``.changes`` / ``.transaction`` for
    row changes); stable for a location.

    ``table_uri`` is the normalized location (``normalize_table_uri``), as it entered the watcher's
    settings or the reader's.

    The table's directory name is its name for people; two watched tables with the same directory
    name must be given topic names in the configuration (the service refuses a collision).
    """
    safe = _NAME_UNSAFE.sub("_", name if name is not None else table_name(table_uri)).strip("._") or "table"
    safe = safe[:MAX_NAME]
    return TableTopics(
        f"{PREFIX}{safe}{ACTIONS_SUFFIX}",
        f"{PREFIX}{safe}{COMMITS_SUFFIX}",
        f"{PREFIX}{safe}{CHANGES_SUFFIX}",
        f"{PREFIX}{safe}{TRANSACTION_SUFFIX}",
    )


def default_commits_topic(actions_topic: str) -> str:
    """The commits topic the watcher pairs with ``actions_topic`` when it named both by default.

    Only a default name (``deltamirror.<name>.actions``) says what its pair is: a topic named in
    the watcher's configuration may have any partner, so guessing would follow a topic that may
    not exist (or belong to another table). Such a name is a :class:`ConfigError`.
    """
    name = actions_topic[len(PREFIX) : -len(ACTIONS_SUFFIX)]
    if not (actions_topic.startswith(PREFIX) and actions_topic.endswith(ACTIONS_SUFFIX) and name):
        raise ConfigError(
            f"{actions_topic!r} is not a default actions topic name (deltamirror.<name>.actions): "
            "give the commits topic by name"
        )
    return f"{PREFIX}{name}{COMMITS_SUFFIX}"


def discovered_topic_name(relative: str, prefix_name: str | None = None) -> str:
    """The ``<name>`` of a discovered table's default topics: its path relative to the prefix,
    ``/`` written ``.`` (``sales/orders`` -> ``sales.orders``), after the prefix's own ``name`` when
    it has one. A path with characters a topic name cannot hold, or with a ``.`` (``a.b/c`` and
    ``a/b.c`` would meet), gets the first 8 hex digits of its sha1 appended, so the name depends on
    the table's path alone and every watcher of a group computes the same one."""
    segments = [s for s in relative.split("/") if s]
    name = ".".join(segments) or "table"
    clean = all(_CLEAN_SEGMENT.match(s) for s in segments)
    if not clean:
        digest = hashlib.sha1(relative.encode(), usedforsecurity=False).hexdigest()[:8]
        name = f"{_UNSAFE_CHAR.sub('_', name).strip('._') or 'table'}-{digest}"
    if prefix_name:
        name = f"{prefix_name}.{name}"
    if len(name) > MAX_NAME:
        digest = hashlib.sha1(name.encode(), usedforsecurity=False).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9]}-{digest}"
    return name


def shared_topics(prefix_uri: str, name: str | None = None) -> TableTopics:
    """The actions and commits topics of every table found under a discover prefix with
    ``topics: shared``: ``deltamirror.<name>.actions`` / ``.commits``, ``<name>`` the prefix's own
    ``name`` when it has one, else the last path segment of its location (as a table's default).
    No changes or transaction topic: a changes topic is never shared (its records are keyed by the
    row alone), so row changes are refused on such a prefix."""
    topics = default_topics(prefix_uri, name=name)
    return TableTopics(topics.actions, topics.commits)


def assignment_topic(group_name: str) -> str:
    """``deltamirror.<name>.shards``: the topic whose partitions are the group's shards."""
    return f"{PREFIX}{group_name}{SHARDS_SUFFIX}"


__all__ = [
    "MAX_NAME",
    "NAME_PATTERN",
    "PREFIX_NAME_PATTERN",
    "PROGRESS_TOPIC",
    "SIGNAL_TOPIC",
    "TOPIC_NAME_RULE",
    "TableTopics",
    "assignment_topic",
    "checked_topic_name",
    "default_commits_topic",
    "default_topics",
    "discovered_topic_name",
    "shared_topics",
    "table_name",
    "topic_name_problem",
]
