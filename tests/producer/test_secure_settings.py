"""Each SASL and TLS setting of a ``kafka:`` section reaches the client: observed on the secured
listener (SCRAM-SHA-512 over TLS, ``secure_kafka``) through ``watch`` (WatchConfig) and a consumer
command reading the same file (KafkaSection).

The right settings connect; the same section with one setting changed is refused at start in one
line, by the broker (a login) or by the client (a TLS file it cannot use). The secured listener
asks no client certificate: the client's certificate, key and key password are observed where
the client loads them (a key that does not open, or does not match the certificate, is refused).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.kafka import SecureBroker
from support.watching import published_version

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

TABLES = Path(__file__).resolve().parents[1] / "data" / "tables"


def _cli(*argv: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltamirror.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )


def _table(root: Path) -> Path:
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(root / "t"), pa.table({"id": [1, 2]}))
    return root / "t"


def _write(path: Path, kafka: dict[str, Any], table: Path, name: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "kafka": kafka,
                "tables": [
                    {
                        "uri": str(table),
                        "actions_topic": f"{name}.actions",
                        "commits_topic": f"{name}.commits",
                        "poll_interval_s": 0.2,
                    }
                ],
                "progress_topic": f"{name}.progress",
                "transactional_id_prefix": name,
                "signal_topic": None,
            }
        )
    )
    return path


def _secrets_absent(broker: SecureBroker, text: str) -> None:
    for secret in broker.secrets:
        assert secret not in text


def _refused(broker: SecureBroker, config: Path, name: str, reason: str) -> None:
    """``watch`` and ``consume-snapshot`` with ``config``: each refused at start, one line naming ``reason``."""
    for argv in (
        ["watch", "--config", str(config), "--no-progress"],
        ["consume-snapshot", "--config", str(config), "--topic", f"{name}.actions", "--once"],
    ):
        started = time.monotonic()
        done = _cli(*argv)
        elapsed = time.monotonic() - started
        assert done.returncode == 2, (argv, done.stderr[-2000:])
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("deltamirror: error: ") and reason in last, (argv, last)
        assert "Traceback" not in done.stderr
        assert elapsed < 60, f"{argv[0]} took {elapsed:.0f} s"
        _secrets_absent(broker, done.stdout + done.stderr)


def _mirrors(broker: SecureBroker, config: Path, name: str) -> None:
    """``watch`` with ``config`` publishes the table (seen through the PLAINTEXT listener), and
    ``consume-snapshot`` with the same file reads it back."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltamirror.cli.main", "watch", "--config", str(config), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while published_version(broker.plaintext, f"{name}.commits") < 0:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "watch did not publish over the secured listener"
            time.sleep(0.3)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    done = _cli("consume-snapshot", "--config", str(config), "--topic", f"{name}.actions", "--once")
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.splitlines()) == 1


def test_each_sasl_setting_is_the_login_the_broker_checks(secure_kafka: SecureBroker, tmp_path: Path) -> None:
    table = _table(tmp_path)
    name = f"dmsasl-{uuid.uuid4().hex[:8]}"
    right = dict(secure_kafka.kafka)
    assert (right["sasl_mechanism"], right["sasl_username"]) == ("SCRAM-SHA-512", "deltamirror")
    _mirrors(secure_kafka, _write(tmp_path / "right.yaml", right, table, name), name)
    for key, wrong in (
        ("sasl_username", "nobody"),
        ("sasl_password", f"not-{secure_kafka.password}"),
        ("sasl_mechanism", "SCRAM-SHA-256"),  # the user has a SCRAM-SHA-512 credential only
    ):
        config = _write(tmp_path / f"{key}.yaml", {**right, key: wrong}, table, f"{name}-{key}")
        _refused(secure_kafka, config, f"{name}-{key}", "authentication failed")


def _client_certificate(folder: Path, password: str) -> tuple[Path, Path, Path]:
    """A self-signed client certificate, its key encrypted with ``password``, and another key."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key, other = folder / "client.pem", folder / "client.key", folder / "other.key"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-days",
                "1",
                "-subj",
                "/CN=deltamirror-client",
            ),
            *("-keyout", str(key), "-out", str(cert), "-passout", f"pass:{password}"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "RSA", "-out", str(other)], check=True, capture_output=True
    )
    return cert, key, other


def test_each_client_certificate_setting_is_loaded_by_the_client(
    secure_kafka: SecureBroker, tmp_path: Path
) -> None:
    table = _table(tmp_path)
    name = f"dmtls-{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    cert, key, other = _client_certificate(tmp_path / "client", password)
    right = {
        **secure_kafka.kafka,
        "ssl_certificate_location": str(cert),
        "ssl_key_location": str(key),
        "ssl_key_password": password,
    }
    _mirrors(secure_kafka, _write(tmp_path / "right.yaml", right, table, name), name)
    for key_name, wrong, reason in (
        ("ssl_key_password", f"not-{password}", "ssl.key.location"),
        ("ssl_key_location", str(other), "ssl.key.location"),
        ("ssl_certificate_location", str(secure_kafka.kafka["ssl_ca_location"]), "ssl"),
    ):
        config = _write(
            tmp_path / f"{key_name}.yaml", {**right, key_name: wrong}, table, f"{name}-{key_name}"
        )
        _refused(secure_kafka, config, f"{name}-{key_name}", reason)
