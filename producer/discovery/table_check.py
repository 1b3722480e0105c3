"""At start, the named tables must exist and their storage must let us in: a typo in a location or
credentials the storage refuses are refused, not retried forever.

A table exists when its ``_delta_log`` holds a commit or a checkpoint (one or two ``info`` calls,
:func:`.discovery.log_has_versions`). A table configured with ``wait_for_table`` (``watch
--wait-for-table``) is waited for instead, said in one line; discovered tables exist by definition.
A location that answers "not there" is refused, and so is one whose storage refuses the request
(access denied, credentials it does not take: :func:`storage_refusal`), naming the table and its
``storage_options``: no retry changes that. Any other storage error (a store that is down, a
timeout) is left to the table's own retries, which say what they meet.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from deltamirror.core.errors import ConfigError
from deltamirror.core.storage import TableStorage, storage_refusal

from ..settings import DiscoverConfig, TableConfig
from .scan import LOG_DIR, log_has_versions

log = logging.getLogger("deltamirror.watch")

#: tables checked at once (object stores answer one request per table)
CHECK_THREADS = 16


@dataclass(frozen=True)
class _Found:
    #: True or False, or None when the storage could not say (left to the table's retries)
    exists: bool | None
    #: why the storage refused the request (access denied, credentials), if it did
    refused: str | None = None


def _check(table: TableConfig) -> _Found:
    try:
        storage = TableStorage(table.uri, table.storage_options_plain())
        return _Found(log_has_versions(storage.fs, f"{storage.root.rstrip('/')}/{LOG_DIR}"))
    except FileNotFoundError:
        return _Found(False)
    except Exception as exc:  # whatever a storage library raises: refused, or retried
        refused = storage_refusal(exc)
        if refused is not None:
            return _Found(None, refused)
        log.warning(
            "cannot tell whether the table exists yet: %s", exc, extra={"table": table.normalized_uri}
        )
        return _Found(None)


def _refusal(what: str, where: str, options: Iterable[str], why: str) -> str:
    """One line: the storage refused ``what`` (``why``); check ``where``'s storage options (by key)."""
    keys = ", ".join(sorted(options)) or "none given: the environment's credentials were used"
    return f"the storage refuses access to {what} ({why}): check {where}.storage_options ({keys})"


def check_tables_exist(tables: list[TableConfig]) -> None:
    """Refuse (ConfigError, exit 2) the named tables that do not exist, unless they are waited for,
    and those whose storage refuses access (whether waited for or not)."""
    if not tables:
        return
    with ThreadPoolExecutor(min(CHECK_THREADS, len(tables)), thread_name_prefix="table-check") as pool:
        found = list(pool.map(_check, tables))
    refused_access = [
        _refusal(f"table {t.normalized_uri}", f"tables[{i}]", t.storage_options, f.refused)
        for i, (t, f) in enumerate(zip(tables, found, strict=True))
        if f.refused
    ]
    if refused_access:
        more = len(refused_access) - 1
        raise ConfigError(refused_access[0] + (f" (and {more} more table(s) refused)" if more else ""))
    missing = [t for t, f in zip(tables, found, strict=True) if f.exists is False]
    refused = [t.normalized_uri for t in missing if not t.wait_for_table]
    if refused:
        shown = ", ".join(refused[:3]) + (f" and {len(refused) - 3} more" if len(refused) > 3 else "")
        raise ConfigError(
            f"no Delta table at {shown} (no _delta_log with a commit or checkpoint): check the "
            "location, or wait for it with --wait-for-table (config wait_for_table: true)"
        )
    for table in missing:
        log.info("waiting for the table to be created", extra={"table": table.normalized_uri})


def _prefix_refused(source: DiscoverConfig) -> str | None:
    """Why the storage refuses to list a discover prefix (None: it lists, or may later)."""
    try:
        storage = TableStorage(source.uri, source.storage_options_plain())
        storage.fs.exists(storage.root)
    except Exception as exc:  # whatever a storage library raises: refused, or retried
        return storage_refusal(exc)
    return None


def check_prefixes_reachable(prefixes: list[DiscoverConfig]) -> None:
    """Refuse (ConfigError, exit 2) a discover prefix whose storage refuses access: no retry of the
    scan changes that. A prefix that does not exist yet, or a store that does not answer, is left to
    the scans, which retry."""
    if not prefixes:
        return
    with ThreadPoolExecutor(min(CHECK_THREADS, len(prefixes)), thread_name_prefix="prefix-check") as pool:
        refused = list(pool.map(_prefix_refused, prefixes))
    for index, (source, why) in enumerate(zip(prefixes, refused, strict=True)):
        if why is None:
            continue
        raise ConfigError(
            _refusal(f"discover prefix {source.uri}", f"discover[{index}]", source.storage_options, why)
        )


__all__ = ["check_prefixes_reachable", "check_tables_exist"]
