"""Discovery under an S3 prefix, through s3fs against a real S3-API server.

Tables are created and deleted by another client between scans, as writers elsewhere would: a scan
must see the store as it is now, not a listing remembered from the scan before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltamirror.producer.discovery.scan import DiscoveryLoop, GoneTables, find_tables
from deltamirror.producer.settings import DiscoverConfig, WatchConfig
from support.s3proxy import S3Proxy
from support.watching import RecordingService

TABLES = Path(__file__).resolve().parents[1] / "data" / "tables"
SMALL = TABLES / "drs__simple_table"

pytestmark = [pytest.mark.s3]


def test_tables_under_an_s3_prefix_are_found_as_they_come_and_go(s3: S3Proxy) -> None:
    prefix = s3.new_prefix("lake")
    s3.upload_table(SMALL, f"{prefix}/sales/orders")
    s3.upload_table(SMALL, f"{prefix}/raw/web/events")
    s3.put(f"{prefix}/misc/readme.txt", b"not a table")
    s3.put(f"{prefix}/empty/_delta_log/.keep", b"")  # a log folder without a commit: not a table
    source: dict[str, Any] = {"uri": s3.url(prefix), "storage_options": s3.storage_options}

    mark = s3.mark()
    found = find_tables(DiscoverConfig.model_validate(source))
    scan_requests = s3.requests(mark)
    assert sorted(t.relative for t in found.values()) == ["raw/web/events", "sales/orders"]
    assert sorted(t.topic_name for t in found.values()) == ["raw.web.events", "sales.orders"]
    assert all(t.uri.startswith(s3.url(prefix) + "/") for t in found.values())
    print(f"one scan of 2 tables under 5 folders: {len(scan_requests)} requests")

    cfg = WatchConfig.model_validate({"kafka": {"bootstrap_servers": "localhost:1"}, "discover": [source]})
    service, gone = RecordingService(), GoneTables()
    loop = DiscoveryLoop(cfg, service, gone=gone)
    loop.scan_now()
    assert sorted(t.topic_name for t in service.added) == ["raw.web.events", "sales.orders"]
    assert all(t.storage_options_plain() == s3.storage_options for t in service.added)

    s3.upload_table(SMALL, f"{prefix}/sales/returns")  # created while running
    mark = s3.mark()
    loop.scan_now()
    assert [t.topic_name for t in service.added][2:] == ["sales.returns"]
    # the tables found before are not listed again: their folders are in their parents' listings
    listed = {r.listed_prefix for r in s3.requests(mark) if r.kind == "LIST"}
    assert not listed & {f"{prefix}/sales/orders/", f"{prefix}/raw/web/events/"}, listed
    assert f"{prefix}/sales/returns/" in listed  # the new one is (its _delta_log is looked for)

    orders = s3.url(f"{prefix}/sales/orders")
    s3.filesystem().rm(f"{s3.bucket}/{prefix}/sales/orders", recursive=True)  # dropped
    loop.scan_now()
    assert orders in gone
    service.running.discard(orders)  # its pipeline published tableDropped and ended
    loop.scan_now()
    assert [uri for uri, _ in service.removed] == [orders]
