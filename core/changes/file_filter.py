"""Keeping a change feed's files by their partition values, before any file is opened.

Files of one partition share their values, so each distinct set of raw values is parsed once
(parsing costs several Arrow calls) and, for a mapping filter, decided once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import arguments
from ..errors import CorruptLogError, InvalidArgumentError, SchemaError
from ..partitions import parse_partition_value, partition_value_of
from ..schema import ColumnMappingMode, StructType

#: ``{column: value or list of values}``, or a callable given ``{column: value}`` for each file
PartitionFilter = Mapping[str, Any] | Callable[[dict[str, Any]], bool]
#: distinct partitions whose parsed values (and verdict) a filter remembers
_PARTITIONS_KEPT = 1024


class FileFilter:
    """Keeps files by their partition values (never opening a file it drops)."""

    def __init__(
        self,
        spec: PartitionFilter | None,
        schema: StructType,
        partition_columns: Sequence[str],
        mode: ColumnMappingMode,
        table: str,
    ) -> None:
        self._spec = spec
        self._mode = mode
        self._table = table
        self._parsed: dict[tuple[str | None, ...], dict[str, Any]] = {}
        self._verdicts: dict[tuple[str | None, ...], bool] = {}
        part_fields = {schema.field(c).name: schema.field(c) for c in partition_columns}
        if spec is None or callable(spec):
            self._fields = list(part_fields.values())
            self._wanted: dict[str, Any] = {}
            return
        self._fields = []
        self._wanted = {}
        for name, value in spec.items():
            try:
                f = schema.field(name)
            except SchemaError:
                raise InvalidArgumentError(
                    f"partition filter names an unknown column {name!r}", table=table
                ) from None
            if f.name not in part_fields:
                raise InvalidArgumentError(
                    f"partition filter column {name!r} is not a partition column "
                    f"(partition columns: {', '.join(part_fields) or 'none'})",
                    table=table,
                )
            self._fields.append(f)
            self._wanted[f.name] = arguments.partition_values(f.name, value, f.type, table)

    def keeps(self, action: Mapping[str, Any], version: int) -> bool:
        if self._spec is None:
            return True
        raw_values = action.get("partitionValues")
        if raw_values is None:
            raise CorruptLogError(
                f"file action for {action.get('path')!r} has no partitionValues to filter on",
                table=self._table,
                version=version,
            )
        raw = tuple(partition_value_of(raw_values, f, self._mode) for f in self._fields)
        if callable(self._spec):  # called for every file, with a dict of its own
            return bool(self._spec(dict(self._values(raw))))
        verdict = self._verdicts.get(raw)
        if verdict is None:
            verdict = self._matches(self._values(raw))
            if len(self._verdicts) >= _PARTITIONS_KEPT:
                self._verdicts.clear()
            self._verdicts[raw] = verdict
        return verdict

    def _values(self, raw: tuple[str | None, ...]) -> dict[str, Any]:
        """``{column: value}`` parsed from one file's raw partition values (shared: do not change)."""
        values = self._parsed.get(raw)
        if values is None:
            values = {
                f.name: parse_partition_value(value, f.type, column=f.name, table=self._table).as_py()
                for f, value in zip(self._fields, raw, strict=True)
            }
            if len(self._parsed) >= _PARTITIONS_KEPT:
                self._parsed.clear()
            self._parsed[raw] = values
        return values

    def _matches(self, values: Mapping[str, Any]) -> bool:
        for name, wanted in self._wanted.items():
            if isinstance(wanted, list | tuple | set | frozenset):
                if values[name] not in wanted:
                    return False
            elif values[name] != wanted:
                return False
        return True
