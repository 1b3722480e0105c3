"""``row_changes.registry.username`` / ``password`` observed against a registry that checks them.

A second real registry (``LocalRegistry(basic_auth=...)``: Apicurio Registry with Quarkus' basic
auth and one embedded user), started for this test alone and stopped after it, and the session's
real broker. The watcher publishes Avro records with the right credentials and confluent-kafka's
``AvroDeserializer`` reads them back with the same; a wrong password, and no credentials, are
refused at start in one line naming the settings (exit 2), the password in no output. Never a mock.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from deltamirror.cli.main import main
from deltamirror.core.changes import read_changes
from deltamirror.core.table import open_table
from support.cdf_tables import cdf_table
from support.watching import watch_row_changes

pytestmark = [pytest.mark.kafka, pytest.mark.registry]

USER = "mirror"
PASSWORD = "s3cret-registry-pw"
WRONG = "wrong-registry-pw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _status(url: str, credentials: tuple[str, str] | None) -> int:
    request = urllib.request.Request(f"{url}/subjects")
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _started_or_skip(code: int, err: str) -> None:
    """A registry that did not start is a skip (a failure in CI)."""
    if code != 0:
        reason = f"no Schema Registry: {err.strip()}"
        if os.environ.get("DELTAMIRROR_REQUIRE_ALL"):  # CI: a missing registry is a failure, not a skip
            pytest.fail(reason)
        pytest.skip(reason)


def test_a_user_without_a_password_file_gets_a_password_made_in_the_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``local registry start --user NAME`` alone: a random password made once in the data dir
    (mode 0600), named by its file in the output, and the registry checks it."""
    from deltamirror.devkafka.registry import PASSWORD_FILE, LocalRegistry

    data_dir = tmp_path / "registry"
    where = ["--port", str(_free_port()), "--data-dir", str(data_dir)]
    code = main(["local", "registry", "start", *where, "--user", USER])
    out, err = capsys.readouterr()
    try:
        _started_or_skip(code, err)
        made = data_dir.resolve() / PASSWORD_FILE
        password = made.read_text().strip()
        assert len(password) >= 24 and made.stat().st_mode & 0o077 == 0
        assert f"basic auth: user {USER}, password in {made}" in out and password not in out + err, out + err
        url = LocalRegistry(port=int(where[1]), data_dir=data_dir).url
        assert (_status(url, None), _status(url, (USER, WRONG)), _status(url, (USER, password))) == (
            401,
            401,
            200,
        )
    finally:
        main(["local", "registry", "stop", *where])


def test_the_registry_credentials_are_checked_used_and_a_refusal_named(
    kafka_bootstrap: str,
    tmp_path: Path,
    kit: Any,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from deltamirror.devkafka.processes import command_line
    from deltamirror.devkafka.registry import LocalRegistry

    # a registry of its own that checks basic credentials, started as a person would (a second
    # JVM, stopped after the test)
    data_dir, secret = tmp_path / "registry", tmp_path / "registry-password"
    secret.write_text(PASSWORD + "\n")
    where = ["--port", str(_free_port()), "--data-dir", str(data_dir)]
    code = main(["local", "registry", "start", *where, "--user", USER, "--password-file", str(secret)])
    out, err = capsys.readouterr()
    try:
        _started_or_skip(code, err)
        # the password by the file holding it, never its value
        assert f"basic auth: user {USER}, password in {secret}" in out and PASSWORD not in out + err, (
            out + err
        )
        secured_registry = LocalRegistry(port=int(where[1]), data_dir=data_dir)
        url = secured_registry.url
        # the registry checks them: none and a wrong password are answered 401, the right ones 200
        assert (_status(url, None), _status(url, (USER, WRONG)), _status(url, (USER, PASSWORD))) == (
            401,
            401,
            200,
        )
        # the password is on no command line and in no file others can read
        pid = secured_registry.status()["pid"]
        assert PASSWORD not in (command_line(pid) or "no command line")
        assert secured_registry.status()["basic_auth"]
        assert secured_registry.users_file.stat().st_mode & 0o077 == 0
        assert PASSWORD not in secured_registry.users_file.read_text()

        path = tmp_path / "t"
        end = cdf_table(path)
        name = kit.unique("avroauth")
        actions, changes = f"{name}.actions", f"{name}.changes"
        registry = {"url": url, "username": USER, "password": PASSWORD}
        watch_row_changes(
            kafka_bootstrap,
            path,
            actions,
            end,
            {"format": "avro", "key_columns": ["id"], "registry": registry},
        )
        client = SchemaRegistryClient({"url": url, "basic.auth.user.info": f"{USER}:{PASSWORD}"})
        values = AvroDeserializer(client)
        records = [r for r in kit.consume(kafka_bootstrap, [changes], idle_s=0.5) if r.value is not None]
        events = [values(r.value, SerializationContext(changes, MessageField.VALUE)) for r in records]
        feed = (
            read_changes(open_table(str(path)), starting_version=0, ending_version=end).to_arrow().to_pylist()
        )
        assert sorted(
            (e["source"]["delta_version"], e["after"]["id"], e["after"]["name"])
            for e in events
            if e["op"] == "c"
        ) == sorted(
            (row["_commit_version"], row["id"], row["name"])
            for row in feed
            if row["_change_type"] == "insert"
        )
        assert events

        # a wrong password, and no credentials: refused at start, one line naming the settings, exit 2
        def watch_with(settings: dict[str, str]) -> tuple[int, str]:
            config = tmp_path / "w.yaml"
            fields = ", ".join(f"{k}: '{v}'" for k, v in settings.items())
            config.write_text(
                f"kafka: {{bootstrap_servers: '{kafka_bootstrap}'}}\n"
                f"tables:\n  - uri: '{path}'\n    snapshot_mode: latest\n"
                f"    actions_topic: {kit.unique('refused')}.actions\n"
                f"    row_changes: {{format: avro, key_columns: [id], registry: {{{fields}}}}}\n"
                f"transactional_id_prefix: {kit.unique('dm')}\n"
            )
            capsys.readouterr()
            code = main(["watch", "--config", str(config)])
            out, err = capsys.readouterr()
            return code, out + err

        caplog.set_level(logging.DEBUG)
        code, output = watch_with({"url": url, "username": USER, "password": WRONG})
        lines = [line for line in output.splitlines() if "row_changes.registry.username" in line]
        assert code == 2 and len(lines) == 1 and "HTTP 401" in lines[0], output
        code, output_none = watch_with({"url": url})
        assert (
            code == 2
            and "without credentials" in output_none
            and "row_changes.registry.password" in output_none
        )
        logged = caplog.text + output + output_none
        assert WRONG not in logged and PASSWORD not in logged
    finally:
        main(["local", "registry", "stop", *where])
