"""The library's arguments, checked where they enter: one error that names the table and the argument.

Every public entry of the core (``open_table``, ``DeltaTable``'s methods, ``Snapshot.to_arrow`` and
``iter_batches``, ``read_changes``) checks what it is given here, before any work: a wrong type or
value is an :class:`~.errors.InvalidArgumentError` whose ``argument`` names the parameter and whose
``table`` names the table, never a ``TypeError``, a ``KeyError`` or a pyarrow error from deep
inside, and never a silent reading of something else (``True`` as version 1, a bare string as a
list of one-letter columns).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from .errors import InvalidArgumentError, SchemaError, UnknownColumnError
from .schema_types import StructType


def _refuse(message: str, argument: str, table: str | None) -> InvalidArgumentError:
    return InvalidArgumentError(f"{argument}: {message}", table=table, argument=argument)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def version(argument: str, value: object, table: str | None, *, optional: bool = True) -> int | None:
    """A version number (an int >= 0); None when ``optional`` and not given."""
    if value is None and optional:
        return None
    if not _is_int(value):
        raise _refuse(f"a version is an integer >= 0, not {_shown(value)}", argument, table)
    assert isinstance(value, int)
    if value < 0:
        raise _refuse(f"a version is an integer >= 0, not {value}", argument, table)
    return value


def version_range(
    start_argument: str, start: int, end_argument: str, end: int | None, table: str | None
) -> None:
    """Both bounds checked, and the end not before the start."""
    version(start_argument, start, table, optional=False)
    version(end_argument, end, table)
    if end is not None and end < start:
        raise _refuse(f"{end} is before {start_argument} {start}", end_argument, table)


def timestamp(argument: str, value: object, table: str | None, *, optional: bool = True) -> Any:
    """A timestamp: ISO-8601 text, epoch milliseconds (an int) or a datetime."""
    if value is None and optional:
        return None
    if isinstance(value, str):
        from .timestamps import parse_timestamp

        try:
            parse_timestamp(value)
        except InvalidArgumentError as exc:
            raise _refuse(exc.message, argument, table) from None
        return value
    if isinstance(value, datetime) or _is_int(value):
        return value
    raise _refuse(
        f"a timestamp is ISO-8601 text, epoch milliseconds (int) or a datetime, not {_shown(value)}",
        argument,
        table,
    )


def positive_int(argument: str, value: object, table: str | None) -> int:
    if not _is_int(value) or not isinstance(value, int) or value <= 0:
        raise _refuse(f"must be an integer > 0, not {_shown(value)}", argument, table)
    return value


def flag(argument: str, value: object, table: str | None) -> bool:
    if not isinstance(value, bool):
        raise _refuse(f"must be True or False, not {_shown(value)}", argument, table)
    return value


def function(argument: str, value: object, table: str | None) -> Any:
    """A callable, or None."""
    if value is not None and not callable(value):
        raise _refuse(f"must be a function or None, not {_shown(value)}", argument, table)
    return value


def options(argument: str, value: object, table: str | None) -> dict[str, Any]:
    """A mapping of option names (strings) to values, or None (no options)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _refuse(f"must be a mapping of option names to values, not {_shown(value)}", argument, table)
    for key in value:
        if not isinstance(key, str):
            raise _refuse(f"option names are strings, not {_shown(key)}", argument, table)
    return dict(value)


def names(argument: str, value: object, table: str | None) -> list[str] | None:
    """A list (any iterable but a bare string) of strings, or None."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise _refuse(f"must be a list of strings, not {_shown(value)}", argument, table)
    out = list(value)
    for item in out:
        if not isinstance(item, str):
            raise _refuse(f"must be a list of strings; it holds {_shown(item)}", argument, table)
    return out


def location(argument: str, value: object) -> str:
    """A table location: a path or URL, as text (``os.PathLike`` taken as its path)."""
    import os

    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise _refuse(f"a table location is a path or URL string, not {_shown(value)}", argument, None)
    return value


def select_columns(
    schema: StructType, columns: object, table: str | None, argument: str = "columns"
) -> list[str] | None:
    """The table's own names of the columns named by ``columns`` (None: all), each once, in the
    order asked.

    Names match as the readers match them (exactly, else case-insensitively, as delta-spark does).
    """
    wanted = names(argument, columns, table)
    if wanted is None:
        return None
    out: list[str] = []
    for name in wanted:
        canonical = column_name(schema, name, table, argument)
        if canonical not in out:
            out.append(canonical)
    return out


def column_name(schema: StructType, name: str, table: str | None, argument: str = "columns") -> str:
    """The table's own name of the top-level column ``name`` (exactly, else case-insensitively, as
    delta-spark matches names), or an :class:`~.errors.UnknownColumnError` naming it and the table."""
    try:
        return schema.field(name).name
    except SchemaError:
        raise UnknownColumnError(
            f"{argument}: no column {name!r} in the table (columns: {', '.join(schema.names)})",
            column=name,
            table=table,
            argument=argument,
        ) from None


def partition_filter_argument(argument: str, value: object, table: str | None) -> Any:
    """``{column: value or list of values}``, a callable given each file's values, or None."""
    if value is None or callable(value):
        return value
    if not isinstance(value, Mapping):
        raise _refuse(
            f"must be a mapping of partition columns to values, or a function, not {_shown(value)}",
            argument,
            table,
        )
    for key in value:
        if not isinstance(key, str):
            raise _refuse(f"partition columns are named by strings, not {_shown(key)}", argument, table)
    return value


def delta_table(argument: str, value: object) -> str:
    """A :class:`~.table.DeltaTable` (what ``open_table`` gives); its URI."""
    from .table import DeltaTable

    if not isinstance(value, DeltaTable):
        raise _refuse(f"must be a DeltaTable (open_table(...)), not {_shown(value)}", argument, None)
    return value.uri


def ict_config(argument: str, value: object, table: str | None) -> None:
    from .timestamps import IctConfig

    if value is not None and not isinstance(value, IctConfig):
        raise _refuse(f"must be an IctConfig or None, not {_shown(value)}", argument, table)


def actions_feed(table: object, metadata: object, metadata_version: object, versions: object) -> str:
    """What :func:`~.changes.changes_from_actions` reads besides the options :func:`change_feed`
    checks: the table, the metaData the rows are read with and its version, the versions."""
    from .models import Metadata

    uri = delta_table("table", table)
    if not isinstance(metadata, Metadata):
        raise _refuse(f"must be a Metadata action, not {_shown(metadata)}", "metadata", uri)
    version("metadata_version", metadata_version, uri, optional=False)
    if isinstance(versions, str | bytes | Mapping) or not isinstance(versions, Iterable):
        raise _refuse(f"must be an iterable of VersionActions, not {_shown(versions)}", "versions", uri)
    return uri


def change_feed(
    table: str,
    *,
    starting_timestamp: object = None,
    ending_timestamp: object = None,
    columns: object = None,
    partition_filter: object = None,
    batch_size: object = 1,
    progress: object = None,
    row_ids: object = False,
) -> None:
    """The arguments of a change-feed read but its versions (whose checks and messages are
    delta-spark's, in :mod:`.changes.ranges`)."""
    timestamp("starting_timestamp", starting_timestamp, table)
    timestamp("ending_timestamp", ending_timestamp, table)
    names("columns", columns, table)
    partition_filter_argument("partition_filter", partition_filter, table)
    positive_int("batch_size", batch_size, table)
    function("progress", progress, table)
    flag("row_ids", row_ids, table)


def partition_values(column: str, value: object, data_type: Any, table: str | None) -> Any:
    """A partition filter's value (or list of values) for ``column``, as the values it is compared
    with are typed (``0`` for an integer column, a ``date`` for a date column): a value that is not
    of the column's type would match no file, so it is refused instead."""
    import pyarrow as pa

    from .schema import to_arrow_type

    target = to_arrow_type(data_type)

    def typed(item: object) -> Any:
        if item is None:
            return None
        try:
            if isinstance(item, bool) != pa.types.is_boolean(target):
                raise TypeError
            converted = pa.scalar(item, type=target).as_py()
            if isinstance(item, int | float | Decimal) and converted != item:
                raise ValueError  # 1.5 for an integer column: pyarrow would cut it to 1
            return converted
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            raise _refuse(
                f"{_shown(item)} is not a value of partition column {column!r} ({data_type.to_json_value()})",
                "partition_filter",
                table,
            ) from None

    if isinstance(value, list | tuple | set | frozenset):
        return [typed(item) for item in value]
    return typed(value)


def _shown(value: object) -> str:
    """A value as an error may show it: its type, and short scalars themselves (never long text)."""
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"a string of {len(value)} characters"
    return f"a {type(value).__name__}"


__all__ = [
    "actions_feed",
    "change_feed",
    "column_name",
    "delta_table",
    "flag",
    "function",
    "ict_config",
    "location",
    "names",
    "options",
    "partition_filter_argument",
    "partition_values",
    "positive_int",
    "select_columns",
    "timestamp",
    "version",
    "version_range",
]
