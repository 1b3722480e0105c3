"""The change data feed (CDF): row-level changes between two versions, as delta-spark reads them.

>>> feed = read_changes(open_table("/data/events"), starting_version=10, ending_version=20)
>>> for batch in feed: ...          # pa.RecordBatch, each from one version, in version order

One job per module: :mod:`.ranges` resolves the bounds, :mod:`.read_schema` picks the schema that
reads the range and checks every version against it, :mod:`.plan` checks the whole range before
any row is read, :mod:`.rows` turns one version's actions into change rows, :mod:`.prefetch`
reads small files ahead on threads, :mod:`.feed` holds the entry points and the feeds.
"""

from ..row_tracking import ROW_COMMIT_VERSION, ROW_ID, ROW_ID_COLUMNS, row_tracking_enabled
from .cdf_columns import CDF_COLUMNS, CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, TIMESTAMP_TYPE
from .feed import (
    DEFAULT_BATCH_SIZE,
    ActionsChangeFeed,
    ChangeFeed,
    VersionActions,
    changes_from_actions,
    read_changes,
)
from .file_filter import PartitionFilter
from .net import NetChangesError, net_changes
from .ranges import ChangeRange, TimestampLike
from .read_schema import (
    ReadSchema,
    check_change_metadata,
    check_change_protocol,
    check_schema_readable,
    is_cdf_enabled,
)

__all__ = [
    "CDF_COLUMNS",
    "CHANGE_TYPE",
    "COMMIT_TIMESTAMP",
    "COMMIT_VERSION",
    "DEFAULT_BATCH_SIZE",
    "ROW_COMMIT_VERSION",
    "ROW_ID",
    "ROW_ID_COLUMNS",
    "TIMESTAMP_TYPE",
    "ActionsChangeFeed",
    "ChangeFeed",
    "ChangeRange",
    "NetChangesError",
    "PartitionFilter",
    "ReadSchema",
    "TimestampLike",
    "VersionActions",
    "changes_from_actions",
    "check_change_metadata",
    "check_change_protocol",
    "check_schema_readable",
    "is_cdf_enabled",
    "net_changes",
    "read_changes",
    "row_tracking_enabled",
]
