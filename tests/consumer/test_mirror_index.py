"""The commits-topic index across refreshes, and the Spark source's options, without Spark.

The index is read against the real broker: records are written here by hand (a plain producer),
so that a refresh can end in the middle of a fragmented record and the next one must resume at
its first fragment, and a missing topic can be asked for.
"""

from __future__ import annotations

import pickle
import uuid

import pytest

from deltamirror.consumer.mirror_changes import MirrorIndex, MirrorSettings
from deltamirror.consumer.spark.options import SourceOptions
from deltamirror.core.errors import ConfigError, InvalidArgumentError
from deltamirror.mirror.errors import KafkaError
from deltamirror.mirror.records.events import SCHEMA_VERSION, CommitSummary

URI = "file:///data/t"
SECRET = "pw-7f3a9c"


def _summary(version: int, operation: str | None = None) -> bytes:
    return CommitSummary(
        schema_version=SCHEMA_VERSION,
        table_id="id-1",
        table_uri=URI,
        version=version,
        commit_timestamp=1_000 + version,
        commit_timestamp_source="file-time",
        snapshot=False,
        action_count=1,
        adds=1,
        removes=0,
        cdc_files=0,
        bytes_added=1,
        bytes_removed=0,
        operation=operation,
    ).to_json_bytes()


# --- options --------------------------------------------------------------------------------------

BASE = {"path": "/data/t", "kafka.bootstrap.servers": " b1:9092 , b2:9093"}


def test_kafka_options_are_checked_as_the_watchers_settings_and_named_by_option() -> None:
    with pytest.raises(ConfigError, match=r"^option kafka\.security\.protocol: must be one of"):
        SourceOptions.parse({**BASE, "kafka.security.protocol": "TLS"})
    with pytest.raises(
        ConfigError, match=r"^option kafka\.sasl\.password: required with sasl_mechanism PLAIN"
    ):
        SourceOptions.parse(
            {
                **BASE,
                "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": "plain",
                "kafka.sasl.username": "u",
            }
        )
    with pytest.raises(ConfigError, match=r"^option kafka\.sasl\.username: SASL settings need"):
        SourceOptions.parse({**BASE, "kafka.sasl.username": "u"})
    with pytest.raises(
        InvalidArgumentError, match=r"kafka\.sasl\.mechanism and option kafka\.sasl\.mechanisms"
    ):
        SourceOptions.parse({**BASE, "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.mechanisms": "PLAIN"})
    with pytest.raises(InvalidArgumentError, match=r"option kafka\.bootstrap\.servers is required"):
        SourceOptions.parse({"path": "/data/t", "kafka.security.protocol": "SSL"})


def test_parsed_options_are_plain_strings_for_the_consumer_and_keep_secrets_out_of_repr() -> None:
    parsed = SourceOptions.parse(
        {
            **BASE,
            "kafka.security.protocol": "sasl_ssl",
            "kafka.sasl.mechanisms": "SCRAM-SHA-512",
            "kafka.sasl.username": "svc",
            "kafka.sasl.password": SECRET,
            "kafka.client.id": "me",
            "kafka.isolation.level": "read_committed",  # what the source's readers do: taken, not passed
            "storage.secret_key": SECRET,
        }
    )
    settings = parsed.settings
    assert settings.bootstrap_servers == "b1:9092,b2:9093"
    assert dict(settings.kafka_config) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": SECRET,
        "client.id": "me",
    }
    assert all(type(v) is str for v in settings.kafka_config.values())
    assert pickle.loads(pickle.dumps(parsed)) == parsed  # Spark ships it to the tasks
    assert SECRET not in repr(parsed)


# --- the index against the real broker --------------------------------------------------------------


@pytest.mark.kafka
def test_a_refresh_resumes_after_the_last_whole_record_and_refuses_one_cut_short(
    kafka_bootstrap: str,
) -> None:
    """The watcher writes a record's fragments in one transaction: a reader never sees part of one
    at the end of a partition, so a record cut short there is refused (naming its first fragment),
    the versions before it kept; a refresh after it reads it again."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    commits = f"idx-{uuid.uuid4().hex[:10]}.commits"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(commits, 1, 1)])[commits].result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})

    def send(value: bytes, *headers: tuple[str, bytes]) -> None:
        producer.produce(commits, value, b"id-1", headers=[("kind", b"commit"), *headers])
        assert producer.flush(30) == 0

    index = MirrorIndex(MirrorSettings(kafka_bootstrap, "unused.actions", commits, URI, idle_timeout_s=30))
    send(_summary(0))
    index.refresh()
    assert (index.first, index.latest) == (0, 0)

    # version 1's summary in three fragments, of which only two are there at the next refresh
    whole = _summary(1, operation="WRITE " + "x" * 2100)  # fragments but the last are 1024+ bytes
    parts = [whole[:1024], whole[1024:2048], whole[2048:]]
    send(parts[0], ("fragment", b"0/3"))
    send(parts[1], ("fragment", b"1/3"))
    index.refresh()
    assert index.refused is not None and "cut short" in str(index.refused)
    assert "offset=1)" in str(index.refused) and index.latest == 0  # what came before it is kept
    index.refresh()  # nothing past it is read
    assert index.latest == 0
    send(parts[2], ("fragment", b"2/3"))
    send(_summary(2))
    index = MirrorIndex(MirrorSettings(kafka_bootstrap, "unused.actions", commits, URI, idle_timeout_s=30))
    index.refresh()  # a new index (a restart): version 1 whole from its first fragment, then version 2
    assert (index.first, index.latest) == (0, 2)
    assert [index.timestamp(v) for v in (0, 1, 2)] == [1_000, 1_001, 1_002]
    index.refresh()  # nothing new: nothing read twice (a repeat of version 2 would be ignored anyway)
    assert index.latest == 2


@pytest.mark.kafka
def test_a_missing_commits_topic_is_a_retryable_kafka_error(kafka_bootstrap: str) -> None:
    index = MirrorIndex(MirrorSettings(kafka_bootstrap, "a", f"no-such-{uuid.uuid4().hex[:8]}", URI))
    with pytest.raises(KafkaError, match="cannot be read") as err:
        index.refresh()
    assert err.value.exit_code == 1
