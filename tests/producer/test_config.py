"""The watcher's configuration: files, validation messages, secrets, environment, CLI overrides."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from deltamirror.core.errors import ConfigError
from deltamirror.mirror.settings import KafkaSettings
from deltamirror.producer.config_file import load_config, redacted
from deltamirror.producer.settings import TABLE_ONLY, TableConfig, WatchConfig, merge_overrides, poll_interval

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
SECRETS = {
    "KAFKA_PASSWORD": "kafka-pw-Zq81",
    "AWS_ACCESS_KEY_ID": "AKIA-test-7731",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-Xk20",
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def doc_example(lang: str) -> str:
    """The complete example of docs/configuration.md in YAML or TOML (the block that starts `# watch.`)."""
    blocks = re.findall(rf"```{lang}\n(# watch\.{lang}\n.*?)```", DOCS.read_text(), re.DOTALL)
    assert len(blocks) == 1, f"docs/configuration.md should have one complete {lang} example"
    return blocks[0]


def revealed(cfg: WatchConfig) -> dict[str, Any]:
    def walk(value: Any) -> Any:
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    result: dict[str, Any] = walk(cfg.model_dump())
    return result


def load_error(tmp_path: Path, text: str, name: str = "bad.yaml") -> str:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message
    return message


MINIMAL = "kafka: {bootstrap_servers: 'localhost:9092'}\ntables: [/data/t]\n"


# --- the documented examples ------------------------------------------------------------------


def test_yaml_example_from_the_docs(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "watch.yaml", doc_example("yaml")), environ=SECRETS)

    assert cfg.kafka.bootstrap_servers == "broker-1.example.com:9093,broker-2.example.com:9093"
    assert cfg.kafka.security_protocol == "SASL_SSL"
    assert cfg.kafka.sasl_mechanism == "SCRAM-SHA-512"
    assert cfg.kafka.sasl_password is not None
    assert cfg.kafka.sasl_password.get_secret_value() == "kafka-pw-Zq81"
    assert [t.uri for t in cfg.tables] == [
        "s3://lake/sales/orders",
        "s3://lake/sales/customers",
        "/data/local/events",
    ]
    orders, customers, events = cfg.tables
    assert orders.storage_options_plain() == {
        "key": "AKIA-test-7731",
        "secret": "aws-secret-Xk20",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    assert (orders.actions_topic, orders.commits_topic) == ("sales.orders.actions", "sales.orders.commits")
    assert customers.storage_options_plain()["endpoint_url"] == "https://s3.eu-west-1.amazonaws.com"
    assert customers.snapshot_mode == "from-timestamp"
    assert customers.from_timestamp_ms == 1_767_225_600_000  # 2026-01-01T00:00:00Z
    assert (events.snapshot_mode, events.from_version, events.poll_interval_s) == ("from-version", 120, 0.2)
    assert cfg.heartbeat_interval_s == 30
    assert (cfg.metrics_host, cfg.metrics_port) == ("0.0.0.0", 9464)
    assert cfg.transactional_id_prefix == "deltamirror-prod"


def test_toml_example_says_the_same_as_the_yaml_one(tmp_path: Path) -> None:
    from_yaml = load_config(write(tmp_path, "watch.yaml", doc_example("yaml")), environ=SECRETS)
    from_toml = load_config(write(tmp_path, "watch.toml", doc_example("toml")), environ=SECRETS)
    assert revealed(from_toml) == revealed(from_yaml)


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "w.yml", MINIMAL), environ={})
    assert cfg.progress_topic == "deltamirror.progress"
    assert cfg.transactional_id_prefix == "deltamirror"
    assert (cfg.txn_max_records, cfg.txn_max_bytes, cfg.txn_max_ms) == (50_000, 64 * 1024 * 1024, 1000)
    assert cfg.heartbeat_interval_s is None
    assert (cfg.metrics_host, cfg.metrics_port) == (None, None)  # the server, when on, at 127.0.0.1
    assert (cfg.max_record_bytes, cfg.oversize_policy, cfg.use_notifications) == (1_000_000, "split", True)
    table = cfg.tables[0]
    assert (table.snapshot_mode, table.from_version, table.from_timestamp) == ("initial", None, None)
    assert (table.actions_topic, table.commits_topic, table.poll_interval_s) == (None, None, None)
    # not set: 1 s, or 30 s while file notifications watch the log on a local disk
    assert (poll_interval(table, notified=False), poll_interval(table, notified=True)) == (1.0, 30.0)
    assert table.storage_options == {}
    assert cfg.kafka.librdkafka_config() == {"bootstrap.servers": "localhost:9092"}


def test_models_are_frozen(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "w.yaml", MINIMAL), environ={})
    with pytest.raises(ValidationError):
        cfg.metrics_port = 1
    with pytest.raises(ValidationError):
        cfg.tables[0].uri = "/elsewhere"


def test_unquoted_timestamps_are_accepted(tmp_path: Path) -> None:
    """YAML and TOML turn unquoted timestamps into datetimes; they mean the same instant."""
    yaml_cfg = load_config(
        write(
            tmp_path,
            "w.yaml",
            "kafka: {bootstrap_servers: b:9092}\ntables:\n  - uri: /t\n    snapshot_mode: from-timestamp\n"
            "    from_timestamp: 2026-03-01T12:00:00.500Z\n",
        ),
        environ={},
    )
    toml_cfg = load_config(
        write(
            tmp_path,
            "w.toml",
            '[kafka]\nbootstrap_servers = "b:9092"\n[[tables]]\nuri = "/t"\nsnapshot_mode = "from-timestamp"\n'
            "from_timestamp = 2026-03-01T12:00:00.500Z\n",
        ),
        environ={},
    )
    expected = 1_772_366_400_500  # 2026-03-01T12:00:00.500Z
    assert yaml_cfg.tables[0].from_timestamp_ms == expected
    assert toml_cfg.tables[0].from_timestamp_ms == expected


def test_relative_paths_are_relative_to_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    monkeypatch.chdir(tmp_path)
    path = write(
        conf_dir,
        "w.yaml",
        "kafka: {bootstrap_servers: b:9092, security_protocol: SSL, ssl_ca_location: certs/ca.pem}\n"
        "tables: [tables/a, {uri: ../b}, s3://bucket/c, /abs/d]\n",
    )
    cfg = load_config(path, environ={})
    assert cfg.kafka.ssl_ca_location == str(conf_dir / "certs" / "ca.pem")
    assert [t.normalized_uri for t in cfg.tables] == [
        f"file://{conf_dir}/tables/a",
        f"file://{tmp_path}/b",
        "s3://bucket/c",
        "file:///abs/d",
    ]


# --- validation messages name the key ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "hint"),
    [
        ("tables: [/t]\n", "kafka", "missing"),
        ("kafka: {bootstrap_servers: b:9092}\ntables: []\n", "tables", "at least one table"),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, snapshotmode: latest}]\n",
            "tables[0].snapshotmode",
            "did you mean 'snapshot_mode'",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [/a, {uri: /t, snapshot_mode: sometimes}]\n",
            "tables[1].snapshot_mode",
            "'initial'",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, snapshot_mode: from-version}]\n",
            "tables[0].from_version",
            "required when snapshot_mode is 'from-version'",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, snapshot_mode: from-timestamp}]\n",
            "tables[0].from_timestamp",
            "required",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, from_version: 3}]\n",
            "tables[0].from_version",
            "only allowed with snapshot_mode 'from-version'",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, snapshot_mode: from-timestamp, from_timestamp: soon}]\n",
            "tables[0].from_timestamp",
            "ISO-8601",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, snapshot_mode: from-version, from_version: -1}]\n",
            "tables[0].from_version",
            "greater than or equal to 0",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, poll_interval_s: 0}]\n",
            "tables[0].poll_interval_s",
            "greater than 0",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [/data/t, /data/x, /data/t/]\n",
            "tables[2].uri",
            "same table as tables[0]",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: ['nosuchproto://x/t']\n",
            "tables[0].uri",
            "unknown storage protocol",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, actions_topic: 'bad topic'}]\n",
            "tables[0].actions_topic",
            "invalid Kafka topic name",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, actions_topic: a, commits_topic: a}]\n",
            "tables[0].commits_topic",
            "must differ",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, commits_topic: p}]\nprogress_topic: p\n",
            "progress_topic",
            "must differ",
        ),
        ("kafka: {bootstrap_servers: b:9092}\ntables: [/t]\nmetrics_port: 70000\n", "metrics_port", "65535"),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [/t]\ntxn_max_records: 0\n",
            "txn_max_records",
            "greater than 0",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [/t]\noversize_policy: drop\n",
            "oversize_policy",
            "'split'",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\ntables: [/t]\nheartbeat_interval_s: -1\n",
            "heartbeat_interval_s",
            "greater than 0",
        ),
        (
            "kafka: {bootstrap_servers: b:9092, security_protocol: TLS}\ntables: [/t]\n",
            "kafka.security_protocol",
            "SASL_SSL",
        ),
        (
            "kafka: {bootstrap_servers: b:9092, sasl_username: u, sasl_password: p}\ntables: [/t]\n",
            "kafka.sasl_username",
            "SASL settings need security_protocol",
        ),
        (  # audit F11: a changes topic on a table without row changes was accepted and unused
            "kafka: {bootstrap_servers: b:9092}\ntables: [{uri: /t, changes_topic: my.changes}]\n",
            "tables[0].changes_topic",
            "is given but the table publishes no row changes",
        ),
        (
            "kafka: {bootstrap_servers: b:9092}\n"
            "tables: [{uri: /t, transaction_topic: my.txn, row_changes: {enabled: false}}]\n",
            "tables[0].transaction_topic",
            "is given but the table publishes no row changes",
        ),
        (  # audit F6: a CA file with PLAINTEXT was accepted and never read
            "kafka: {bootstrap_servers: b:9092, ssl_ca_location: /ca.pem}\ntables: [/t]\n",
            "kafka.ssl_ca_location",
            "TLS settings need security_protocol SSL or SASL_SSL (it is PLAINTEXT)",
        ),
        (
            "kafka: {bootstrap_servers: b:9092, security_protocol: SASL_PLAINTEXT, sasl_mechanism: GSSAPI,"
            " ssl_key_password: k}\ntables: [/t]\n",
            "kafka.ssl_key_password",
            "TLS settings need security_protocol SSL or SASL_SSL (it is SASL_PLAINTEXT)",
        ),
        (
            "kafka: {bootstrap_servers: b:9092, security_protocol: SASL_SSL, sasl_mechanism: PLAIN, sasl_username: u}\n"
            "tables: [/t]\n",
            "kafka.sasl_password",
            "required with sasl_mechanism PLAIN",
        ),
        (
            "kafka: {bootstrap_servers: b:9092, extra: {transactional.id: mine}}\ntables: [/t]\n",
            'kafka.extra["transactional.id"]',
            "the watcher sets this property",
        ),
        (
            "kafka: {bootstrap_servers: b:9092, extra: {sasl.password: x}}\ntables: [/t]\n",
            'kafka.extra["sasl.password"]',
            "kafka.sasl_password instead",
        ),
        (
            "kafka: {bootstrap_servers: b:9092, extra: {message.max.bytes: 500000}}\ntables: [/t]\n",
            "max_record_bytes",
            "message.max.bytes",
        ),
    ],
)
def test_validation_error_names_file_and_key(tmp_path: Path, text: str, key: str, hint: str) -> None:
    message = load_error(tmp_path, text)
    assert f"{key}: " in message
    assert hint in message


def test_every_problem_is_reported_on_one_line(tmp_path: Path) -> None:
    message = load_error(
        tmp_path, "kafka: {bootstrap_servers: b:9092}\ntables: [/t]\nmetrics_port: x\ntxn_max_ms: 0\nfoo: 1\n"
    )
    for key in ("metrics_port: ", "txn_max_ms: ", "foo: unknown key"):
        assert key in message


@pytest.mark.parametrize(
    ("name", "text", "hint"),
    [
        (
            "dup.yaml",
            "kafka: {bootstrap_servers: b:9092}\ntables: [/t]\nkafka: {bootstrap_servers: c:9092}\n",
            "duplicate key 'kafka'",
        ),
        ("broken.yaml", "kafka: [\n", "invalid YAML"),
        ("broken.toml", "[kafka\n", "invalid TOML"),
        ("list.yaml", "- a\n- b\n", "must be a mapping"),
        ("empty.yaml", "", "must be a mapping"),
        ("w.json", "{}", "use a .yaml, .yml or .toml file"),
    ],
)
def test_unreadable_files(tmp_path: Path, name: str, text: str, hint: str) -> None:
    assert hint in load_error(tmp_path, text, name)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found") as err:
        load_config(tmp_path / "nope.yaml")
    assert err.value.file == str(tmp_path / "nope.yaml")


# --- secrets ----------------------------------------------------------------------------------

SECRET_YAML = """
kafka:
  bootstrap_servers: b:9093
  security_protocol: SASL_SSL
  sasl_mechanism: PLAIN
  sasl_username: svc
  sasl_password: kafka-pw-Zq81
  ssl_key_location: /k.pem
  ssl_key_password: key-pw-Lm44
  extra:
    sasl.oauthbearer.client.secret: oauth-secret-Yy09
    client.id: visible-client
tables:
  - uri: abfs://container/t
    storage_options:
      account_name: visibleaccount
      account_key: azure-key-Pp53
      sas_token: sas-token-Qq61
      connection_string: conn-string-Rr70
      client_kwargs:
        aws_secret_access_key: nested-secret-Ss88
      anon: false
"""
SECRET_VALUES = [
    "kafka-pw-Zq81",
    "key-pw-Lm44",
    "oauth-secret-Yy09",
    "azure-key-Pp53",
    "sas-token-Qq61",
    "conn-string-Rr70",
    "nested-secret-Ss88",
]


@pytest.fixture
def secret_cfg(tmp_path: Path) -> WatchConfig:
    return load_config(write(tmp_path, "s.yaml", SECRET_YAML), environ={})


def test_secrets_never_appear_in_repr_str_or_redacted(secret_cfg: WatchConfig) -> None:
    shown = [
        repr(secret_cfg),
        str(secret_cfg),
        repr(secret_cfg.kafka),
        str(secret_cfg.tables[0]),
        str(redacted(secret_cfg)),
        secret_cfg.model_dump_json(),
    ]
    for text in shown:
        for secret in SECRET_VALUES:
            assert secret not in text
    # what is not secret stays readable
    data = redacted(secret_cfg)
    assert data["kafka"]["extra"] == sorted(secret_cfg.kafka.extra)  # kafka.extra: keys only
    assert data["kafka"]["sasl_username"] == "svc"
    assert data["tables"][0]["storage_options"]["account_name"] == "visibleaccount"
    assert data["tables"][0]["storage_options"]["anon"] is False
    assert data["kafka"]["sasl_password"] == "***"
    assert data["tables"][0]["storage_options"]["client_kwargs"]["aws_secret_access_key"] == "***"


def test_redacted_masks_secret_looking_plain_strings() -> None:
    """Even a config built without validation (model_construct) does not leak through redacted()."""
    table = TableConfig.model_construct(
        uri="s3://b/t",
        storage_options={"secret": "raw-secret-Tt11", "token": {"refresh": "raw-token-Uu22"}, "region": "eu"},
        snapshot_mode="initial",
        from_version=None,
        from_timestamp=None,
        actions_topic=None,
        commits_topic=None,
        poll_interval_s=1.0,
    )
    cfg = WatchConfig(kafka=KafkaSettings(bootstrap_servers="b:9092"), tables=[TableConfig(uri="/t")])
    cfg = cfg.model_copy(update={"tables": [table]})
    text = str(redacted(cfg))
    assert "raw-secret-Tt11" not in text
    assert "raw-token-Uu22" not in text
    assert "'region': 'eu'" in text


def test_librdkafka_config_reveals_secrets(secret_cfg: WatchConfig) -> None:
    assert secret_cfg.kafka.librdkafka_config() == {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "svc",
        "sasl.password": "kafka-pw-Zq81",
        "ssl.key.location": "/k.pem",
        "ssl.key.password": "key-pw-Lm44",
        "sasl.oauthbearer.client.secret": "oauth-secret-Yy09",
        "client.id": "visible-client",
    }


def test_storage_options_plain_reveals_secrets(secret_cfg: WatchConfig) -> None:
    assert secret_cfg.tables[0].storage_options_plain() == {
        "account_name": "visibleaccount",
        "account_key": "azure-key-Pp53",
        "sas_token": "sas-token-Qq61",
        "connection_string": "conn-string-Rr70",
        "client_kwargs": {"aws_secret_access_key": "nested-secret-Ss88"},
        "anon": False,
    }


def test_librdkafka_values_are_strings(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            "w.toml",
            '[kafka]\nbootstrap_servers = "b:9092"\n[kafka.extra]\n"linger.ms" = 5\n'
            '"socket.keepalive.enable" = true\n"enable.ssl.certificate.verification" = false\n'
            '[[tables]]\nuri = "/t"\n',
        ),
        environ={},
    )
    conf = cfg.kafka.librdkafka_config()
    assert conf["linger.ms"] == "5"
    assert conf["socket.keepalive.enable"] == "true"
    assert conf["enable.ssl.certificate.verification"] == "false"


def test_validation_errors_do_not_echo_secret_values(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        "kafka: {bootstrap_servers: b:9092, extra: {sasl.oauthbearer.client.secret: [oauth-secret-Yy09]}}\n"
        "tables: [{uri: /t, storage_options: {secret: [aws-secret-Xk20]}, poll_interval_s: kafka-pw-Zq81}]\n",
    )
    assert 'kafka.extra["sasl.oauthbearer.client.secret"]' in message
    assert "tables[0].poll_interval_s" in message
    for secret in ("oauth-secret-Yy09", "aws-secret-Xk20", "kafka-pw-Zq81"):
        assert secret not in message


LEAK = "leaky-value-Vv42"


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        # a YAML error on the line that holds the secret
        ("q.yaml", f"kafka:\n  sasl_password: '{LEAK}\n", "invalid YAML"),
        ("a.yaml", f"kafka: {{bootstrap_servers: b:9092}}\ntables: [*{LEAK}]\n", "line=2"),
        ("t.yaml", f"kafka: !{LEAK} x\n", "line=1"),
        ("m.yaml", f"kafka:\n  sasl_password: {LEAK}: x\n", "mapping values are not allowed here"),
        ("bad.toml", f"[kafka]\nsasl_password = {LEAK}\n", "invalid TOML"),
        ("s.toml", f'[kafka]\nsasl_password = "{LEAK}\n', "line 2"),
        # validation: the key is named, its value is not
        (
            "u.yaml",
            f"kafka: {{bootstrap_servers: b:9092, sasl_pasword: {LEAK}}}\ntables: [/t]\n",
            "unknown key",
        ),
        (
            "v.yaml",
            f"kafka: {{bootstrap_servers: b:9092, sasl_password: [{LEAK}]}}\ntables: [/t]\n",
            "kafka.sasl_password",
        ),
        (
            "w.yaml",
            f"kafka: {{bootstrap_servers: '{LEAK}'}}\ntables: [/t]\n",
            "kafka.bootstrap_servers: the entry has no port",
        ),
        ("x.yaml", f"kafka: {{bootstrap_servers: 'u:{LEAK}@b:9092'}}\ntables: [/t]\n", "holds credentials"),
        (
            "y.yaml",
            f"kafka: {{bootstrap_servers: b:9092}}\ntables: [{{uri: /t, actions_topic: '{LEAK} x'}}]\n",
            "tables[0].actions_topic: invalid Kafka topic name",
        ),
        (
            "z.yaml",
            f"kafka: {{bootstrap_servers: b:9092}}\ntables: [{{uri: /t, snapshot_mode: from-timestamp, from_timestamp: '{LEAK}'}}]\n",
            "tables[0].from_timestamp: not a timestamp",
        ),
    ],
)
def test_configuration_errors_never_echo_values(tmp_path: Path, name: str, text: str, where: str) -> None:
    message = load_error(tmp_path, text, name)
    assert where in message
    assert LEAK not in message
    assert LEAK[:-3] not in message  # not even a part of it


def test_unknown_key_is_named(tmp_path: Path) -> None:
    """Keys are names, not values: an unknown key is named so that the typo can be found."""
    message = load_error(tmp_path, "kafka: {bootstrap_servers: b:9092}\ntables: [/t]\nmetricsport: 1\n")
    assert "metricsport: unknown key (did you mean 'metrics_port'?)" in message


def test_yaml_error_names_line_and_column(tmp_path: Path) -> None:
    message = load_error(tmp_path, "kafka:\n  bootstrap_servers: b:9092\n\t- x\n")
    assert "line=3" in message and "column=1" in message


# --- environment interpolation ----------------------------------------------------------------


def test_env_interpolation(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "w.yaml",
        "kafka:\n"
        '  bootstrap_servers: "${BROKER_HOST}:${BROKER_PORT:-9092}"\n'
        "  security_protocol: SASL_SSL\n  sasl_mechanism: SCRAM-SHA-256\n"
        '  sasl_username: "${KAFKA_USER:-deltamirror}"\n'
        '  sasl_password: "${KAFKA_PASSWORD}"\n'
        "tables:\n"
        '  - uri: "s3://${BUCKET}/t"\n'
        '    storage_options: {secret: "${AWS_SECRET_ACCESS_KEY}", note: "costs $5, literal $${HOME}"}\n'
        'metrics_port: "${METRICS_PORT}"\n',
    )
    env = {
        "BROKER_HOST": "kafka",
        "KAFKA_PASSWORD": "kafka-pw-Zq81",
        "BUCKET": "lake",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-Xk20",
        "METRICS_PORT": "9464",
        "KAFKA_USER": "",
    }
    cfg = load_config(path, environ=env)
    conf = cfg.kafka.librdkafka_config()
    assert conf["bootstrap.servers"] == "kafka:9092"
    assert conf["sasl.username"] == "deltamirror"  # empty -> default
    assert conf["sasl.password"] == "kafka-pw-Zq81"
    assert cfg.tables[0].uri == "s3://lake/t"
    assert cfg.tables[0].storage_options_plain() == {
        "secret": "aws-secret-Xk20",
        "note": "costs $5, literal ${HOME}",
    }
    assert cfg.metrics_port == 9464
    assert "kafka-pw-Zq81" not in repr(cfg)


def test_env_interpolation_uses_os_environ_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DM_TEST_BROKER", "broker-from-env:9092")
    cfg = load_config(
        write(tmp_path, "w.toml", 'tables = ["/t"]\n[kafka]\nbootstrap_servers = "${DM_TEST_BROKER}"\n')
    )
    assert cfg.kafka.bootstrap_servers == "broker-from-env:9092"


def test_unset_env_var_names_the_key_and_the_variable(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        'kafka: {bootstrap_servers: b:9092, extra: {"sasl.password.x": "${NOT_SET_ANYWHERE}"}}\ntables: [/t]\n',
    )
    assert 'kafka.extra["sasl.password.x"]' in message
    assert "NOT_SET_ANYWHERE is not set" in message


def test_malformed_reference_is_an_error(tmp_path: Path) -> None:
    message = load_error(tmp_path, 'kafka: {bootstrap_servers: "${1BAD}"}\ntables: [/t]\n')
    assert "kafka.bootstrap_servers: malformed" in message


# --- the command line -------------------------------------------------------------------------


def test_overrides_alone() -> None:
    cfg = merge_overrides(
        None,
        {
            "bootstrap_servers": "localhost:9092",
            "tables": ["s3://b/a", "s3://b/t"],
            "snapshot_mode": "from-version",
            "from_version": 7,
            "storage_options": {"key": "AKIA-test-7731", "region": "eu"},
            "poll_interval_s": 0.5,
            "metrics_port": 0,
        },
    )
    assert cfg.kafka.librdkafka_config() == {"bootstrap.servers": "localhost:9092"}
    assert [t.uri for t in cfg.tables] == ["s3://b/a", "s3://b/t"]
    assert all(t.snapshot_mode == "from-version" and t.from_version == 7 for t in cfg.tables)
    assert all(t.poll_interval_s == 0.5 for t in cfg.tables)
    assert cfg.tables[1].storage_options_plain() == {"key": "AKIA-test-7731", "region": "eu"}
    assert "AKIA-test-7731" not in repr(cfg)
    assert cfg.metrics_port == 0


def test_overrides_alone_defaults_and_errors() -> None:
    cfg = merge_overrides(None, {"bootstrap_servers": "b:9092", "tables": ["/t"]})
    assert cfg.tables[0].snapshot_mode == "initial"
    with pytest.raises(ConfigError, match="no table"):
        merge_overrides(None, {"bootstrap_servers": "b:9092", "tables": []})
    with pytest.raises(ConfigError, match=r"tables\[0\]\.from_version: required"):
        merge_overrides(
            None, {"bootstrap_servers": "b:9092", "tables": ["/t"], "snapshot_mode": "from-version"}
        )
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_servers: is empty"):
        merge_overrides(None, {"bootstrap_servers": "", "tables": ["/t"]})
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_servers: required key is missing"):
        merge_overrides(None, {"tables": ["/t"]})


def test_every_top_level_setting_can_be_overridden(tmp_path: Path) -> None:
    """Each top-level key of the file is an override by the same name (no list to keep in step)."""
    cfg = load_config(write(tmp_path, "w.yaml", MINIMAL), environ={})
    given = {
        "progress_topic": "p2",
        "transactional_id_prefix": "tx2",
        "txn_max_records": 7,
        "txn_max_bytes": 4096,
        "txn_max_ms": 9,
        "heartbeat_interval_s": 2.5,
        "metrics_host": "0.0.0.0",
        "metrics_port": 9555,
        "max_record_bytes": 2048,
        "oversize_policy": "fail",
        "use_notifications": False,
        "signal_topic": "s2",
        "status_interval_s": 5.0,
        "broker_timeout_s": 7.0,
        "workers": 3,
    }
    # discover (like tables) adds to the file's list: tests/producer/test_discovery.py
    # group (--group NAME) keeps the file's group settings: tests/producer/test_group.py
    assert set(given) == set(WatchConfig.model_fields) - {"kafka", "tables", "discover", "group"}
    merged = merge_overrides(cfg, given)
    assert {key: getattr(merged, key) for key in given} == given


def test_an_unknown_override_is_a_type_error(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "w.yaml", MINIMAL), environ={})
    with pytest.raises(TypeError, match="snapshotmode"):
        merge_overrides(cfg, {"snapshotmode": "latest"})
    with pytest.raises(TypeError, match="kafka"):
        merge_overrides(cfg, {"kafka": {"bootstrap_servers": "x:1"}})


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "w.yaml",
        "kafka: {bootstrap_servers: 'file-broker:9092', security_protocol: SASL_SSL, sasl_mechanism: PLAIN,"
        " sasl_username: u, sasl_password: kafka-pw-Zq81}\n"
        "tables:\n"
        "  - {uri: 's3://b/a', snapshot_mode: from-version, from_version: 3, storage_options: {region: us, x: 1}}\n"
        "  - {uri: 's3://b/b', snapshot_mode: latest, actions_topic: b.actions}\n"
        "metrics_port: 9000\nprogress_topic: file.progress\n",
    )
    cfg = load_config(path, environ={})
    merged = merge_overrides(
        cfg,
        {
            "bootstrap_servers": "flag-broker:9092",
            "tables": ["s3://b/b/", "s3://b/c"],
            "from_timestamp": "2026-01-01T00:00:00Z",
            "storage_options": {"region": "eu"},
            "metrics_port": 9464,
        },
    )
    assert merged.kafka.bootstrap_servers == "flag-broker:9092"
    assert merged.kafka.librdkafka_config()["sasl.password"] == "kafka-pw-Zq81"  # kept, still secret
    assert isinstance(merged.kafka.sasl_password, SecretStr)
    assert [t.uri for t in merged.tables] == ["s3://b/a", "s3://b/b", "s3://b/c"]
    assert merged.tables[1].actions_topic == "b.actions"  # the file's entry wins over the bare flag
    for table in merged.tables:
        assert table.snapshot_mode == "from-timestamp"
        assert table.from_version is None
        assert table.from_timestamp == "2026-01-01T00:00:00Z"
        assert table.storage_options_plain()["region"] == "eu"
    assert merged.tables[0].storage_options_plain()["x"] == 1
    assert merged.metrics_port == 9464
    assert merged.progress_topic == "file.progress"  # not given: unchanged

    unchanged = merge_overrides(cfg, {"metrics_host": None, "tables": [], "storage_options": {}})
    assert revealed(unchanged) == revealed(cfg)


def test_overrides_are_validated(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "w.yaml", MINIMAL), environ={})
    with pytest.raises(ConfigError, match=r"tables\[0\]\.from_timestamp: required"):
        merge_overrides(cfg, {"snapshot_mode": "from-timestamp"})
    with pytest.raises(ConfigError, match=r"metrics_port"):
        merge_overrides(cfg, {"metrics_port": -1})


# --- discover prefixes: every per-table setting reaches the tables found, or is refused by name -------

#: a value other than the default for each setting a prefix gives its tables (a new one must be added
#: here: the test below fails until it is, and then checks it reaches the discovered tables)
_NOT_DEFAULT: dict[str, Any] = {
    "storage_options": {"region": "eu"},
    "snapshot_mode": "from-timestamp",
    "from_timestamp": "2026-01-01T00:00:00Z",
    "row_changes": {"key_columns": ["id"], "tombstones": True},
    "poll_interval_s": 0.25,
    "allowed_path_prefixes": ["/source"],
    "drop_file_stats": True,
}


def _found(prefix: dict[str, Any]) -> TableConfig:
    from deltamirror.producer.discovery.scan import DiscoveredTable, discovered_config
    from deltamirror.producer.settings import DiscoverConfig

    source = DiscoverConfig.model_validate(prefix)
    return discovered_config(DiscoveredTable(f"{source.uri}/t", "t", "t"), source)


def test_every_setting_of_a_table_is_inherited_from_its_prefix_or_refused_on_one() -> None:
    from deltamirror.producer.discovery.scan import INHERITED
    from deltamirror.producer.settings import TABLE_ONLY, DiscoverConfig

    table_settings = set(TableConfig.model_fields) - {"uri"}
    assert set(INHERITED) | set(TABLE_ONLY) == table_settings
    assert not set(INHERITED) & set(TABLE_ONLY)
    assert not set(TABLE_ONLY) & set(DiscoverConfig.model_fields)
    assert set(_NOT_DEFAULT) == set(INHERITED)
    table = _found({"uri": "s3://lake", **_NOT_DEFAULT})  # storage options: an object store
    for name, value in _NOT_DEFAULT.items():
        start = {"snapshot_mode": "from-timestamp", "from_timestamp": _NOT_DEFAULT["from_timestamp"]}
        expected = TableConfig.model_validate({"uri": "s3://lake/x", **start, name: value})
        assert getattr(table, name) == getattr(expected, name), name
        assert getattr(table, name) != TableConfig.model_fields[name].get_default(call_default_factory=True)


@pytest.mark.parametrize("name", sorted(TABLE_ONLY))
def test_a_table_only_setting_on_a_prefix_is_refused_by_name(tmp_path: Path, name: str) -> None:
    sample = {"from_version": 3, "when_deleted": "wait", "wait_for_table": True}.get(name, "x")
    text = f"kafka: {{bootstrap_servers: 'k:9092'}}\ndiscover:\n  - uri: /lake\n    {name}: {sample}\n"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "w.yaml", text), environ={})
    assert f"discover[0].{name}: not a setting of a discover prefix" in str(info.value)


def test_every_per_table_override_reaches_discovered_tables_or_is_refused() -> None:
    """Each per-table override given with only a discover prefix: the table found takes it, or the
    whole command line is refused in one line naming it."""
    from deltamirror.producer.settings import TABLE_OVERRIDES

    samples: dict[str, Any] = {
        "snapshot_mode": "latest",
        "from_version": 3,
        "from_timestamp": "2026-01-01T00:00:00Z",
        "storage_options": {"region": "eu"},
        "poll_interval_s": 0.25,
        "row_changes": True,
        "row_format": "json-schema",
        "schema_registry_url": "http://registry:8081",
        "subject_name_strategy": "record",
        "net_catch_up": True,
        "wait_for_table": True,
    }
    assert set(samples) == set(TABLE_OVERRIDES)
    plain = _found(
        merge_overrides(None, {"bootstrap_servers": "k:9092", "discover": ["/lake"]}).discover[0].model_dump()
    )
    for name, value in samples.items():
        overrides = {"bootstrap_servers": "k:9092", "discover": ["/lake"], name: value}
        try:
            cfg = merge_overrides(None, overrides)
        except ConfigError as exc:
            assert name in str(exc) and "discover" in str(exc), name
            assert "\n" not in str(exc)
            continue
        table = _found(cfg.discover[0].model_dump())
        assert table != plain, f"{name} was taken but does not reach the discovered tables"


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("    row_changes: {net_catch_up: true}\n", "snapshot_mode from-version or from-timestamp"),
        (
            "    snapshot_mode: latest\n    row_changes: {net_catch_up: true}\n",
            "snapshot_mode from-version or from-timestamp",
        ),
        (
            "    snapshot_mode: from-version\n    from_version: 0\n"
            "    row_changes: {enabled: false, net_catch_up: true}\n",
            "row changes are not enabled",
        ),
    ],
)
def test_net_catch_up_that_cannot_apply_is_refused_by_name(tmp_path: Path, entry: str, problem: str) -> None:
    for where in ("tables", "discover"):
        if where == "discover" and "from-version" in entry:
            continue  # a prefix refuses from-version by itself
        text = f"kafka: {{bootstrap_servers: 'k:9092'}}\n{where}:\n  - uri: /lake\n{entry}"
        with pytest.raises(ConfigError) as info:
            load_config(write(tmp_path, "w.yaml", text), environ={})
        assert f"{where}[0].row_changes" in str(info.value) and problem in str(info.value)


def test_a_poll_interval_set_applies_whether_notifications_watch_the_log_or_not() -> None:
    table = TableConfig(uri="/t", poll_interval_s=0.5)
    assert (poll_interval(table, notified=False), poll_interval(table, notified=True)) == (0.5, 0.5)
