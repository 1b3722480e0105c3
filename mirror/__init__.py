"""deltamirror.mirror: the wire, written once: what deltamirror writes to Kafka and reads back.

The records of the topics (their models, the one decoder of each topic), fragments, topic names,
the Kafka settings every command shares, the Spark DDL of the topics' values and the wire's errors.
``deltamirror.core`` never imports this package; ``deltamirror.producer`` and
``deltamirror.consumer`` both do. Rooms: ``records/`` (the encoders, decoders, headers, fragments,
the consumers' boundary, the row-change formats), ``kafka/`` (the typed confluent-kafka wrappers:
the one producer, the one read loop, the group protocol), ``topic_names.py`` (the names), ``topics.py`` (their creation), ``settings.py``,
``errors.py``. The names below are the API; the modules are private.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltamirror.core.faces import lazy_exports

if TYPE_CHECKING:
    from .errors import (
        EventStreamError,
        KafkaError,
        ProducerFencedError,
        RecordTooLargeError,
        RetriableKafkaError,
        TopicNotFoundError,
    )
    from .records.events import (
        COMMITS_KINDS,
        SCHEMA_VERSION,
        ActionEvent,
        CommitsTopicRecord,
        CommitSummary,
        Heartbeat,
        ProgressRecord,
        TableDropped,
        TableReplaced,
        decode_action_event,
        decode_commits_record,
        decode_progress,
        json_schema,
    )
    from .records.fragments import FragmentAssembler, FragmentError, KeyedFragments
    from .records.spark_ddl import (
        ACTIONS_DDL,
        COMMITS_DDL,
        TRANSACTION_DDL,
        TRANSACTION_KEY_DDL,
        row_changes_ddl,
        row_changes_key_ddl,
    )
    from .settings import KafkaSettings
    from .topic_names import TableTopics, default_commits_topic, default_topics

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "COMMITS_KINDS": ".records.events",
        "SCHEMA_VERSION": ".records.events",
        "ActionEvent": ".records.events",
        "CommitSummary": ".records.events",
        "CommitsTopicRecord": ".records.events",
        "Heartbeat": ".records.events",
        "ProgressRecord": ".records.events",
        "TableDropped": ".records.events",
        "TableReplaced": ".records.events",
        "decode_action_event": ".records.events",
        "decode_commits_record": ".records.events",
        "decode_progress": ".records.events",
        "json_schema": ".records.events",
        "FragmentAssembler": ".records.fragments",
        "FragmentError": ".records.fragments",
        "KeyedFragments": ".records.fragments",
        "ACTIONS_DDL": ".records.spark_ddl",
        "COMMITS_DDL": ".records.spark_ddl",
        "TRANSACTION_DDL": ".records.spark_ddl",
        "TRANSACTION_KEY_DDL": ".records.spark_ddl",
        "row_changes_ddl": ".records.spark_ddl",
        "row_changes_key_ddl": ".records.spark_ddl",
        "TableTopics": ".topic_names",
        "default_commits_topic": ".topic_names",
        "default_topics": ".topic_names",
        "KafkaSettings": ".settings",
        "EventStreamError": ".errors",
        "KafkaError": ".errors",
        "ProducerFencedError": ".errors",
        "RecordTooLargeError": ".errors",
        "RetriableKafkaError": ".errors",
        "TopicNotFoundError": ".errors",
    },
)

__all__ = [
    "ACTIONS_DDL",
    "COMMITS_DDL",
    "COMMITS_KINDS",
    "SCHEMA_VERSION",
    "TRANSACTION_DDL",
    "TRANSACTION_KEY_DDL",
    "ActionEvent",
    "CommitSummary",
    "CommitsTopicRecord",
    "EventStreamError",
    "FragmentAssembler",
    "FragmentError",
    "Heartbeat",
    "KafkaError",
    "KafkaSettings",
    "KeyedFragments",
    "ProducerFencedError",
    "ProgressRecord",
    "RecordTooLargeError",
    "RetriableKafkaError",
    "TableDropped",
    "TableReplaced",
    "TableTopics",
    "TopicNotFoundError",
    "decode_action_event",
    "decode_commits_record",
    "decode_progress",
    "default_commits_topic",
    "default_topics",
    "json_schema",
    "row_changes_ddl",
    "row_changes_key_ddl",
]
