"""The consumers' boundary: a record read from the mirror is checked once, as core checks a log line.

The topics are input like the log: whoever can write to them can write anything. Every reader of
the mirror (``consume-snapshot``, ``invalidate``, the change feed read from the mirror, the Spark
source) takes its records through the one decoder (:mod:`.events`, :mod:`.event_batches`) and the
one read loop (:mod:`..kafka.consumer`, :mod:`.fragments`), which hold each record to these rules
before anything is made of it:

- **its shape and bounds** (the models of :mod:`.events`): a ``schemaVersion`` this deltamirror
  reads (another one is refused by name), ids, locations and text within their lengths, versions
  and sizes 64-bit integers, ``count`` and ``index`` 32-bit ones with ``index < count``; a whole
  record (fragments joined) within :attr:`RecordLimits.max_record_bytes`, fragments bounded in
  count, bytes and time;
- **its action, by core's own rules for a log line**: the validators of
  :mod:`deltamirror.core.action_rules` (required fields, exact types, ranges), on the batch
  decoder's Arrow rows those of :mod:`deltamirror.core.checkpoint_checks`;
- **every path the action names** (a data file, a change data file, a deletion vector, a sidecar)
  inside the table root, or under a prefix the reader allows (``allowed_path_prefixes``, a
  shallow clone's source), by core's containment rules (:class:`~deltamirror.core.paths.PathRules`,
  :func:`~deltamirror.core.deletion_vectors.check_dv_paths`) relative to the record's ``tableUri``;
- **its location**: ``tableUri`` a normalized location (as the watcher writes it), under one of
  the locations the reader is configured for, when it is (``table_locations``); a table's
  location is the one first seen for its ``tableId`` (:class:`TablePins`, kept by each reader:
  no record moves a known table elsewhere, not even a ``tableReplaced``).

A record that breaks a rule is a :class:`BadRecordError` naming topic, partition and offset. What
the reader does then (stop after delivering every version before it, or skip it) is the reader's
``on_bad_record`` choice (:data:`BAD_RECORD_CHOICES`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import pyarrow as pa
from pydantic_core import ValidationError

from deltamirror.core.action_rules import field_problem, validator_for
from deltamirror.core.actions import Where
from deltamirror.core.checkpoint_checks import check_file_rows
from deltamirror.core.deletion_vectors import check_dv_paths
from deltamirror.core.errors import DeltaMirrorError, InvalidArgumentError
from deltamirror.core.paths import PathRules, Place
from deltamirror.core.redact import redact
from deltamirror.core.storage.uri import normalize_table_uri

from ..errors import EventStreamError

if TYPE_CHECKING:
    from deltamirror.core.storage import TableStorage

MiB = 1 << 20

#: what a reader does with a record the boundary refuses
OnBadRecord = Literal["stop", "skip", "dead-letter"]
BAD_RECORD_CHOICES: tuple[OnBadRecord, ...] = ("stop", "skip", "dead-letter")

#: the longest text of a refused value or location quoted in a message or a log line
SHOWN_CHARS = 200


#: the longest refusal message (a forged field name or value must not make a line of megabytes)
MESSAGE_CHARS = 1000


class BadRecordError(EventStreamError):
    """A record the consumers' boundary refuses: it breaks the contract or a rule of the log.

    Names topic, partition and offset (of the record's first fragment for a split one). The
    message is one line of at most :data:`MESSAGE_CHARS` characters, whatever the record held.
    """

    def __init__(self, message: str, **context: Any) -> None:
        message = " ".join(message.split())
        if len(message) > MESSAGE_CHARS:
            message = f"{message[:MESSAGE_CHARS]}... (cut at {MESSAGE_CHARS} characters)"
        super().__init__(message, **context)


@dataclass(frozen=True)
class RecordLimits:
    """How much one record, and a reader's bookkeeping of records, may hold.

    ``max_record_bytes``: a whole record, fragments joined (the watcher splits a value larger than
    its ``max_record_bytes``, 1 MB by default, so only an action of tens of megabytes comes near).
    ``max_fragments``, ``fragment_wait_s``: the fragments of one record, and how long the first
    may wait for the last. The watcher writes them in one transaction, so on a topic of one table a
    reader sees them all at once; on a topic shared by many tables another producer's transaction
    may open between them, and a ``read_committed`` reader sees the first fragments (below the last
    stable offset) and the rest only when that transaction ends, which the broker forces within
    ``transaction.max.timeout.ms`` (15 minutes by default): hence 16 minutes. A record cut short
    at a partition's end with nothing past it is refused at once, without this wait.
    ``max_tables``: distinct tables a reader keeps state for (an id never seen before, past
    that, is refused). ``max_retired``: ids of replaced or dropped tables remembered (the oldest
    are forgotten first). ``max_actions_per_version``: the ``count`` a version (or snapshot) may
    say, so what a reader holds of a version still incomplete (a snapshot of 50 million files
    passes; a record saying more is refused at once, not after its actions were gathered).
    ``max_pending_records``, ``max_pending_bytes``: what a reader holds of records come in part,
    all keys and partitions together (on a shared topic other tables' records may come between a
    record's fragments, so a reader joins many at once: :class:`~.fragments.KeyedFragments`).
    """

    max_record_bytes: int = 64 * MiB
    max_fragments: int = 65_536
    fragment_wait_s: float = 960.0
    max_tables: int = 10_000
    max_retired: int = 10_000
    max_actions_per_version: int = 50_000_000
    max_pending_records: int = 1_000
    max_pending_bytes: int = 256 * MiB

    def __post_init__(self) -> None:
        for name in (
            "max_record_bytes",
            "max_fragments",
            "max_tables",
            "max_retired",
            "max_actions_per_version",
            "max_pending_records",
            "max_pending_bytes",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, not {value!r}")
        if not self.fragment_wait_s > 0:
            raise InvalidArgumentError(f"fragment_wait_s must be more than 0, not {self.fragment_wait_s!r}")


def shown(text: object) -> str:
    """A value as a message quotes it: one line, credentials hidden, at most :data:`SHOWN_CHARS`."""
    value = redact(" ".join(str(text).split()))
    return value if len(value) <= SHOWN_CHARS else f"{value[:SHOWN_CHARS]}... ({len(value)} characters)"


class _RulesAsStorage:
    """What core's deletion-vector path check asks of a table's storage, from the rules alone: a
    reader judges a path without reaching the table's storage (nor needing its filesystem)."""

    def __init__(self, rules: PathRules) -> None:
        self.uri = rules.table
        self._rules = rules

    def check_paths(self, paths: pa.Array | pa.ChunkedArray, *, kind: str = "data file") -> None:
        self._rules.check_column(paths, kind)

    def resolve(self, path: str, *, kind: str = "data file", literal: bool = False) -> str:
        return self._rules.place(path, kind, literal).path


#: the kind core names each action's files by (its refusals say "data file ... lies outside")
_FILE_KINDS = {"add": "data file", "remove": "data file", "cdc": "change data file"}
_DV_TYPE = pa.struct(
    [
        pa.field("storageType", pa.string()),
        pa.field("pathOrInlineDv", pa.string()),
        pa.field("offset", pa.int64()),
    ]
)
#: PathRules and location checks remembered per location (a reader sees few)
_CACHED = 1024


def _as_the_watcher_writes(uri: str) -> bool:
    """``uri`` is a location as the watcher writes one (:func:`normalize_table_uri`): an absolute,
    normalized ``file://`` path (taken as it is: a local name may hold ``#`` or ``%``), or a URL of
    a known store without a password or a trailing slash."""
    if uri.startswith("file://"):
        path = uri[len("file://") :]
        return path.startswith("/") and "\x00" not in path and os.path.abspath(path) == path
    try:
        return normalize_table_uri(uri) == uri
    except DeltaMirrorError:
        return False


class RecordRules:
    """What a reader accepts besides the contract: its locations, prefixes and limits.

    ``table_locations``: the locations (URIs or local paths) under which tables may be; empty:
    any location (each table still pinned to its first one, :class:`TablePins`).
    ``allowed_path_prefixes``: locations outside a table root whose files its actions may name
    (a shallow clone's source), as ``--allow-path-prefix`` for core's readers.
    """

    def __init__(
        self,
        *,
        table_locations: Iterable[str] = (),
        allowed_path_prefixes: Iterable[str] = (),
        limits: RecordLimits | None = None,
    ) -> None:
        self.limits = limits if limits is not None else RecordLimits()
        self.table_locations = tuple(normalize_table_uri(str(p)) for p in table_locations)
        self._locations: tuple[Place, ...] = tuple(PathRules(uri).root for uri in self.table_locations)
        self.allowed_path_prefixes = tuple(allowed_path_prefixes)
        self._paths: dict[str, PathRules] = {}
        self._checked: dict[str, str | None] = {}
        if self.allowed_path_prefixes:
            # a prefix that is not on any store the tables may be on is refused when a table is
            # met; a prefix that is no location at all, now
            for prefix in self.allowed_path_prefixes:
                if not isinstance(prefix, str) or not prefix.strip():
                    raise InvalidArgumentError("an allowed path prefix is empty")

    # --- locations ---------------------------------------------------------------------------

    def location_problem(self, uri: str) -> str | None:
        """Why ``uri`` is not a location this reader takes tables from, or None."""
        if uri in self._checked:
            return self._checked[uri]
        problem: str | None = None
        if not _as_the_watcher_writes(uri):
            problem = f"tableUri {shown(uri)!r} is not a table location as the watcher writes one"
        elif self._locations:
            place = PathRules(uri).root
            if not any(a == place or a.holds(place) for a in self._locations):
                problem = (
                    f"tableUri {shown(uri)!r} is not under the table locations this consumer reads "
                    f"({', '.join(map(shown, self.table_locations))}; --allow-table-location adds one)"
                )
        if len(self._checked) >= _CACHED:
            self._checked.clear()
        self._checked[uri] = problem
        return problem

    def count_problem(self, count: int) -> str | None:
        """Why a version of ``count`` actions is more than this reader holds, or None."""
        limit = self.limits.max_actions_per_version
        if count > limit:
            return f"a version of {count} actions is more than a reader holds ({limit})"
        return None

    def path_rules(self, uri: str) -> PathRules:
        """Core's path rules for the table at ``uri`` (a location :meth:`location_problem` took)."""
        rules = self._paths.get(uri)
        if rules is None:
            rules = PathRules(uri, self.allowed_path_prefixes)
            if len(self._paths) >= _CACHED:
                self._paths.clear()
            self._paths[uri] = rules
        return rules

    # --- actions -----------------------------------------------------------------------------

    def action_problem(self, uri: str, action_type: str, action: Any) -> str | None:
        """Why an action of the table at ``uri`` breaks core's rules for a log line, or None."""
        try:
            value = validator_for(action_type).validate_python(action)
        except ValidationError as exc:
            return field_problem(action_type, exc)
        try:
            self._check_paths(uri, action_type, value)
        except DeltaMirrorError as exc:
            return exc.message
        return None

    def _check_paths(self, uri: str, action_type: str, value: Any) -> None:
        kind = _FILE_KINDS.get(action_type)
        if kind is None and action_type != "sidecar":
            return
        rules = self.path_rules(uri)
        path = value["path"]
        if action_type == "sidecar":
            rules.place(path, "sidecar", False)
            return
        assert kind is not None
        if not PathRules.is_plain(path, False):
            rules.place(path, kind, False)
        dv = value.get("deletionVector")
        if dv is not None and dv["storageType"] != "i":
            descriptor = {k: dv.get(k) for k in ("storageType", "pathOrInlineDv", "offset")}
            check_dv_paths(self._storage(rules), pa.array([descriptor], _DV_TYPE))

    def file_rows_problem(self, uri: str, kind: str, rows: pa.Table) -> str | None:
        """Why ``add`` or ``remove`` rows decoded into a checkpoint's columns break core's rules for
        them (:mod:`deltamirror.core.checkpoint_checks`) or name a path outside, or None."""
        try:
            check_file_rows(kind, rows, Where(uri, None))
            rules = self.path_rules(uri)
            rules.check_column(rows["path"], _FILE_KINDS[kind])
            check_dv_paths(self._storage(rules), rows["deletionVector"])
        except DeltaMirrorError as exc:
            return exc.message
        return None

    @staticmethod
    def _storage(rules: PathRules) -> TableStorage:
        return cast("TableStorage", _RulesAsStorage(rules))


#: a reader that was given no rules: any normalized location, no prefix outside a table root
DEFAULT_RULES = RecordRules()


class TablePins:
    """The location of each table a reader knows (its ``tableId``'s first one): records that say
    otherwise are refused. At most ``limits.max_tables`` tables."""

    def __init__(self, limits: RecordLimits | None = None, pins: Mapping[str, str] | None = None) -> None:
        self.limits = limits if limits is not None else RecordLimits()
        self._uris: dict[str, str] = dict(pins or {})

    def __contains__(self, table_id: object) -> bool:
        return table_id in self._uris

    def __len__(self) -> int:
        return len(self._uris)

    def get(self, table_id: str) -> str | None:
        return self._uris.get(table_id)

    def problem(self, table_id: str, uri: str) -> str | None:
        """Why a record of ``table_id`` at ``uri`` cannot be taken, or None (then :meth:`pin` it)."""
        pinned = self._uris.get(table_id)
        if pinned is None:
            if len(self._uris) >= self.limits.max_tables:
                return (
                    f"table {shown(table_id)} would be table {len(self._uris) + 1} of this consumer; it "
                    f"keeps at most {self.limits.max_tables}"
                )
            return None
        if pinned != uri:
            return (
                f"tableUri {shown(uri)!r} of table {shown(table_id)} is not where that table is "
                f"({shown(pinned)}): records never move a table (a table at a new location is a new "
                "table to a consumer: start it with a new state)"
            )
        return None

    def pin(self, table_id: str, uri: str) -> None:
        self._uris.setdefault(table_id, uri)

    def forget(self, table_id: str) -> None:
        self._uris.pop(table_id, None)


__all__ = [
    "BAD_RECORD_CHOICES",
    "DEFAULT_RULES",
    "BadRecordError",
    "OnBadRecord",
    "RecordLimits",
    "RecordRules",
    "TablePins",
    "shown",
]
