"""The default names of a table's event topics: one rule for the watcher and its consumers.

The watcher names the topics of a table it was given no names for; a consumer that was told only
the actions topic needs the matching commits topic (it carries ``tableReplaced``). Both sides must
agree on the rule without the consumer importing the producer, so it lives here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError
from .storage import normalize_table_uri

PREFIX = "deltamirror."
ACTIONS_SUFFIX = ".actions"
COMMITS_SUFFIX = ".commits"

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class TableTopics:
    actions: str
    commits: str


def default_topics(uri: str) -> TableTopics:
    """``deltamirror.<last path segment>.actions`` / ``.commits``; stable for a location.

    The table's directory name is its name for people; two watched tables with the same directory
    name must be given topic names in the configuration (the service refuses a collision).
    """
    name = normalize_table_uri(uri).rstrip("/").rsplit("/", 1)[-1] or "table"
    name = _NAME_UNSAFE.sub("_", name).strip("._") or "table"
    name = name[:200]
    return TableTopics(f"{PREFIX}{name}{ACTIONS_SUFFIX}", f"{PREFIX}{name}{COMMITS_SUFFIX}")


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


__all__ = ["TableTopics", "default_commits_topic", "default_topics"]
