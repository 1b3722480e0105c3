"""What a table's row events carry: its rows filtered, its columns projected and masked.

Applied to every Arrow batch of change rows (and of a snapshot's rows) before they are encoded, so
the records, their keys and a format's schema all see the same columns. Each image of an update is
filtered on its own: when both pass the event is an update; when only the earlier one does, the row
left the filter and the event is a delete; when only the later one does, it entered and the event
is a create — what a downstream copy of the filtered rows needs to stay right.

A mask is no projection: ``drop`` leaves the column out, ``hmac`` keeps it with the hex
HMAC-SHA256 of each value's text under a secret key, so that equal values stay equal (joins and
keys still work) while the value cannot be read back or guessed by hashing candidates, as a plain
hash of a low-cardinality column could. Values are hashed once per distinct value of a batch.

Checked against the table's columns before a unit's rows are read (:meth:`RowTransform.check_names`)
and against their types at the first batch of each schema (:meth:`RowTransform.check_types`): a
setting that names a column the table lacks, or a mask or predicate its type cannot take, stops the
table with one line naming the setting, as a key column the table lacks does.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

import pyarrow as pa

from deltamirror.core.compute import pc
from deltamirror.core.errors import ConfigError
from deltamirror.core.head import read_head
from deltamirror.core.row_tracking import ROW_ID_COLUMNS
from deltamirror.core.table import open_table

from ..settings import RowChangesConfig, RowPredicate, TableConfig

#: the change feed's own columns: always carried, never filtered, projected or masked
_FEED_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
_FEED_AND_ROW_ID_COLUMNS = (*_FEED_COLUMNS, *ROW_ID_COLUMNS)
_COMPARE = {
    "=": "equal",
    "!=": "not_equal",
    "<": "less",
    "<=": "less_equal",
    ">": "greater",
    ">=": "greater_equal",
}


class RowTransform:
    """One table's filter, projection and masks (:class:`~..settings.RowChangesConfig`)."""

    def __init__(self, config: RowChangesConfig, *, table: str) -> None:
        self.config = config
        self.table = table
        self._key = config.mask_key.get_secret_value().encode() if config.mask_key is not None else b""
        #: the batch schemas checked already (a table has one, or a few across schema changes)
        self._checked: set[pa.Schema] = set()

    @classmethod
    def of(cls, config: RowChangesConfig, *, table: str) -> RowTransform | None:
        """The transform the settings ask for (None: the rows go out as they are)."""
        if config.columns is None and not config.mask and not config.where:
            return None
        return cls(config, table=table)

    def check_names(self, columns: Sequence[str], version: int) -> None:
        """A ConfigError naming the setting that names a column the table lacks (its ``columns``)."""
        problem = row_settings_problem(self.config, columns, keys=False)  # keys: said by the source
        if problem is not None:
            raise self._error(problem, version)

    def check_types(self, schema: pa.Schema, version: int, *, row_ids: bool = False) -> None:
        """A ConfigError naming the mask or predicate the type of its column cannot take."""
        if schema in self._checked:
            return
        feed_columns = _feed_columns(row_ids)
        self.check_names([n for n in schema.names if n not in feed_columns], version)
        for column, how in self.config.mask.items():
            if how == "hmac" and _nested(schema.field(column).type):
                raise self._error(
                    f"row_changes.mask cannot hmac column {column!r}: its type {schema.field(column).type} "
                    "is nested (mask it with drop)",
                    version,
                )
        for predicate in self.config.where:
            try:
                _literals(predicate, schema.field(predicate.column).type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError, ValueError):
                raise self._error(
                    f"row_changes.where: {predicate.value!r} is not a value of column {predicate.column!r} "
                    f"({schema.field(predicate.column).type})",
                    version,
                ) from None
        self._checked.add(schema)

    def apply(self, batch: pa.RecordBatch, version: int, *, row_ids: bool = False) -> pa.RecordBatch:
        """The rows of ``batch`` that pass, with the published columns (masked) and the feed's
        (``_row_id`` and ``_row_commit_version`` among them when ``row_ids``: the rows' key)."""
        feed_columns = _feed_columns(row_ids)
        self.check_types(batch.schema, version, row_ids=row_ids)
        if self.config.where:
            batch = batch.filter(self._passes(batch), null_selection_behavior="drop")
        columns: Sequence[str] = (
            self.config.columns
            if self.config.columns is not None
            else [n for n in batch.schema.names if n not in feed_columns]
        )
        # the table's order, whatever order the setting lists them in
        wanted = set(columns)
        out_names: list[str] = []
        out_arrays: list[pa.Array] = []
        for name in batch.schema.names:
            feed = name in feed_columns
            if not feed and (name not in wanted or self.config.mask.get(name) == "drop"):
                continue
            array = batch.column(name)
            if not feed and self.config.mask.get(name) == "hmac":
                array = self._hmac(array)
            out_names.append(name)
            out_arrays.append(array)
        return pa.RecordBatch.from_arrays(out_arrays, names=out_names)

    def _passes(self, batch: pa.RecordBatch) -> pa.Array:
        mask: pa.Array | None = None
        for predicate in self.config.where:
            column = batch.column(predicate.column)
            literal = _literals(predicate, column.type)
            if predicate.op == "is null":
                holds = pc.is_null(column)
            elif predicate.op == "is not null":
                holds = pc.is_valid(column)
            elif predicate.op in ("in", "not in"):  # a null is in no list, and not out of one either
                found = pc.is_in(column, value_set=literal)
                holds = pc.and_kleene(
                    found if predicate.op == "in" else pc.invert(found), pc.is_valid(column)
                )
            else:
                holds = getattr(pc, _COMPARE[predicate.op])(column, literal)
            mask = holds if mask is None else pc.and_kleene(mask, holds)
        assert mask is not None
        return mask

    def _hmac(self, array: pa.Array) -> pa.Array:
        t = array.type
        if not (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
        ):
            array = pc.cast(array, pa.string())  # a value's text, as the docs say it is hashed
        encoded = pc.dictionary_encode(array)
        distinct = encoded.dictionary.to_pylist()
        key = self._key
        digests = pa.array(
            [
                hmac.new(key, v if isinstance(v, bytes) else v.encode(), hashlib.sha256).hexdigest()
                for v in distinct
            ],
            pa.string(),
        )
        return pc.take(digests, encoded.indices)

    def _error(self, message: str, version: int) -> ConfigError:
        return ConfigError(message, table=self.table, version=version)


def row_settings_problem(
    config: RowChangesConfig, columns: Sequence[str], *, keys: bool = True
) -> str | None:
    """What of a table's ``row_changes`` names a column the table lacks (None: nothing), in the
    words of the setting: for a check at start, before the first unit is read (``keys``: the key
    columns too)."""
    named = [("key_columns", c) for c in config.key_columns] if keys else []
    named += [("columns", c) for c in config.columns or ()]
    named += [("mask", c) for c in config.mask]
    named += [("where", p.column) for p in config.where]
    for setting, column in named:
        if column not in columns:
            return f"row_changes.{setting} names {column!r}, not a column of the table (columns: {', '.join(columns)})"
    return None


def check_row_settings(tables: Sequence[TableConfig]) -> None:
    """Refuse (ConfigError, exit 2) a configured table whose ``row_changes`` names a column the table
    lacks, at start: its schema is read from the log's head (metaData only, no file list). Tables
    that name no column, do not exist yet (waited for) or cannot be read now are left to their
    first unit, which checks the same."""
    for index, table in enumerate(tables):
        config = table.row_changes
        if config is None or not config.enabled:
            continue
        if not (config.key_columns or config.columns is not None or config.mask or config.where):
            continue
        try:
            opened = open_table(
                table.uri, table.storage_options_plain(), allowed_path_prefixes=table.allowed_path_prefixes
            )
            columns = read_head(
                opened, opened.latest_version(), check_features=False
            ).metadata.table_schema.names
        except Exception:
            continue
        problem = row_settings_problem(config, columns)
        if problem is not None:
            raise ConfigError(f"tables[{index}].{problem}", table=table.normalized_uri)


def _nested(type_: pa.DataType) -> bool:
    return bool(pa.types.is_nested(type_) or pa.types.is_dictionary(type_))


def _literals(predicate: RowPredicate, type_: pa.DataType) -> pa.Scalar | pa.Array | None:
    """The predicate's value as ``type_`` (an array for ``in``); a cast that loses it is refused."""
    if predicate.op in ("is null", "is not null"):
        return None
    if _nested(type_):
        raise TypeError("a nested column has no comparisons")
    if predicate.op in ("in", "not in"):
        return pa.array(predicate.value).cast(type_, safe=True)
    return pa.scalar(predicate.value).cast(type_, safe=True)


__all__ = ["RowTransform", "check_row_settings", "row_settings_problem"]


def _feed_columns(row_ids: bool) -> tuple[str, ...]:
    """The columns a transform passes on as they are: the change feed's, and the row ids when the
    rows are keyed by them."""
    return _FEED_AND_ROW_ID_COLUMNS if row_ids else _FEED_COLUMNS
