"""At start, the named tables must exist: a typo in a location is refused, not retried forever.

A table exists when its ``_delta_log`` holds a commit or a checkpoint (one or two ``info`` calls,
:func:`.discovery.log_has_versions`). A table configured with ``wait_for_table`` (``watch
--wait-for-table``) is waited for instead, said in one line; discovered tables exist by definition.
Only a location that answers "not there" is refused: a storage error (credentials, a store that
is down) is left to the table's own retries, which say what they meet.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from deltamirror.core.errors import ConfigError, DeltaMirrorError
from deltamirror.core.storage import TableStorage

from ..settings import TableConfig
from .scan import LOG_DIR, log_has_versions

log = logging.getLogger("deltamirror.watch")

#: tables checked at once (object stores answer one request per table)
CHECK_THREADS = 16


def _exists(table: TableConfig) -> bool | None:
    """True or False, or None when the storage could not say (left to the table's retries)."""
    try:
        storage = TableStorage(table.uri, table.storage_options_plain())
        return log_has_versions(storage.fs, f"{storage.root.rstrip('/')}/{LOG_DIR}")
    except FileNotFoundError:
        return False
    except (DeltaMirrorError, OSError) as exc:
        log.warning(
            "cannot tell whether the table exists yet: %s", exc, extra={"table": table.normalized_uri}
        )
        return None


def check_tables_exist(tables: list[TableConfig]) -> None:
    """Refuse (ConfigError, exit 2) the named tables that do not exist, unless they are waited for."""
    if not tables:
        return
    with ThreadPoolExecutor(min(CHECK_THREADS, len(tables)), thread_name_prefix="table-check") as pool:
        found = list(pool.map(_exists, tables))
    missing = [t for t, exists in zip(tables, found, strict=True) if exists is False]
    refused = [t.normalized_uri for t in missing if not t.wait_for_table]
    if refused:
        shown = ", ".join(refused[:3]) + (f" and {len(refused) - 3} more" if len(refused) > 3 else "")
        raise ConfigError(
            f"no Delta table at {shown} (no _delta_log with a commit or checkpoint): check the "
            "location, or wait for it with --wait-for-table (config wait_for_table: true)"
        )
    for table in missing:
        log.info("waiting for the table to be created", extra={"table": table.normalized_uri})


__all__ = ["check_tables_exist"]
