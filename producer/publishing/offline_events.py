"""``deltamirror events``: the action records the watcher would publish, without Kafka.

The values are made by the watcher's own units of work and encoder, so they are byte for byte
the values of the records on the actions topic (the golden record test holds both to that): a
user can see what a table will look like in Kafka before running a broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from deltamirror.core.errors import InvalidArgumentError, LogGapError, VersionNotFoundError
from deltamirror.core.table import open_table

from ..tailing.summaries import envelope_encoder
from ..tailing.watcher import TableWatcher
from ..tailing.work import CommitWork
from .transactions import BATCH


def iter_event_values(
    uri: str,
    storage_options: dict[str, Any] | None = None,
    *,
    starting_version: int | None = None,
    ending_version: int | None = None,
    allowed_path_prefixes: Iterable[str] = (),
) -> Iterator[bytes]:
    """The action-event values the watcher publishes for versions [start, end], without Kafka.

    They are made from the commit files alone, never from a file a commit names: there is nothing
    for ``allowed_path_prefixes`` to allow, and any given is refused (it would do nothing).
    """
    prefixes = tuple(allowed_path_prefixes)
    if prefixes:
        raise InvalidArgumentError(
            "allowed_path_prefixes: the events are made from the commit files alone, never from a "
            "file the log names: there is nothing outside the table root to allow",
            table=uri,
            argument="allowed_path_prefixes",
        )
    table = open_table(uri, storage_options, allowed_path_prefixes=prefixes)
    latest = table.latest_version()
    commits = table.listing(0).commits
    start = starting_version if starting_version is not None else min(commits, default=latest + 1)
    end = ending_version if ending_version is not None else latest
    if start < 0 or end < 0 or (end < start and starting_version is not None):
        raise InvalidArgumentError(f"invalid version range [{start}, {end}]", table=table.uri)
    if start > end:
        return  # a log with no commit file left (only a checkpoint): no action to print
    if end > latest:
        raise VersionNotFoundError(
            f"version {end} does not exist; the latest version is {latest}", table=table.uri, version=end
        )
    watcher = TableWatcher(
        uri,
        storage_options,
        mode="from-version",
        from_version=start,
        allowed_path_prefixes=prefixes,
    )
    watcher.start(None)
    try:
        while watcher.cursor < end:
            work = watcher.next_work()
            if work is None:
                missing = watcher.cursor + 1
                raise LogGapError(
                    f"commit {missing} is missing from the log (versions up to {end} exist)",
                    table=watcher.uri,
                    version=missing,
                )
            if not isinstance(work, CommitWork) or work.version > end:
                return
            encoder = envelope_encoder(work)
            index = work.start
            for batch in work.batches(BATCH):
                yield from encoder.encode_many(index, batch)
                index += len(batch)
    finally:
        watcher.close()


__all__ = ["iter_event_values"]
