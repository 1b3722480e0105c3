"""Debezium events expected from a change feed, by the documented pairing rule, for compatibility tests.

Written independently of the encoder: an update's images become one ``u`` only when key columns are
configured and the key occurs exactly once as a pre-image and once as a post-image in the version;
otherwise the pre-image is a ``d`` and the post-image a ``c``. Inputs are the expected change feeds
of ``tests/data/expected/cdf`` (delta-spark / delta-kernel-rs results, cells as text or native).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

Image = tuple[str | None, ...]
#: (op, before, after, version)
Event = tuple[str, Image | None, Image | None, int]


def text(value: Any) -> str | None:
    """A cell as the expected files write it (booleans lower-case, numbers as their text)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def table_columns(expected: dict[str, Any]) -> list[str]:
    """The table's own columns of an expected file (those before ``_change_type``)."""
    columns: list[str] = expected["columns"]
    return columns[: columns.index("_change_type")]


def expected_events(expected: dict[str, Any], key: Sequence[str]) -> Counter[Event]:
    """(op, before, after, version) of every change event of an expected change feed."""
    columns = table_columns(expected)
    c_type = expected["columns"].index("_change_type")
    c_version = expected["columns"].index("_commit_version")
    by_version: dict[int, list[tuple[str, Image]]] = defaultdict(list)
    for row in expected["rows"]:
        image = tuple(text(v) for v in row[: len(columns)])
        by_version[int(row[c_version])].append((row[c_type], image))
    key_at = [columns.index(k) for k in key]
    events: Counter[Event] = Counter()
    for version, rows in by_version.items():
        counts: Counter[tuple[str, Image]] = Counter(
            (kind, tuple(image[i] for i in key_at)) for kind, image in rows if kind.startswith("update_")
        )
        pre: dict[Image, Image] = {}
        post: dict[Image, Image] = {}
        for kind, image in rows:
            k = tuple(image[i] for i in key_at)
            pairable = (
                bool(key) and counts[("update_preimage", k)] == 1 and counts[("update_postimage", k)] == 1
            )
            if kind == "update_preimage" and pairable:
                pre[k] = image
            elif kind == "update_postimage" and pairable:
                post[k] = image
            elif kind in ("insert", "update_postimage"):
                events[("c", None, image, version)] += 1
            elif kind in ("delete", "update_preimage"):
                events[("d", image, None, version)] += 1
            else:
                raise AssertionError(f"unexpected _change_type {kind}")
        assert pre.keys() == post.keys()
        for k, before in pre.items():
            events[("u", before, post[k], version)] += 1
    return events
