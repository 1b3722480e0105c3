"""The local broker's secured listener: a TLS certificate of its own CA and one SCRAM user.

``deltamirror local kafka start --security scram-tls`` adds a ``SASL_SSL`` listener to the
PLAINTEXT one (which stays as it was: the broker's own traffic and existing users keep it). Its
material lives in ``<data dir>/security/`` and is made once, at the first secured start, with the
``openssl`` binary (no Python dependency); later starts reuse it, so a client's CA file and password
stay valid for the life of the data dir:

    ca.pem              the CA certificate: give it to clients (``ssl_ca_location``)
    ca.key              its private key (mode 0600; only used to sign server.p12)
    server.p12          the broker's key and certificate (PKCS12; SAN IP:127.0.0.1, DNS:localhost)
    keystore-password   server.p12's password (mode 0600; also in server.properties, mode 0600)
    scram-password      the SCRAM-SHA-512 user's password (mode 0600)
    kafka-client.yaml   a ``kafka:`` section for ``--config`` with all of the above (mode 0600)

PKCS12 rather than a PEM keystore: Kafka wants a file-based PEM key encrypted, and Java's support
for the PBES2 ciphers openssl encrypts PKCS#8 keys with varies across 17.x builds; every Java 17
reads openssl's PKCS12. The SCRAM credential is written through the Admin API over the PLAINTEXT
listener at every secured start (an upsert: idempotent, and it works on a data dir formatted
before the listener existed).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from deltamirror.core.errors import ConfigError, EnvironmentMissingError
from deltamirror.mirror.errors import KafkaError
from deltamirror.mirror.settings import KafkaSettings, reveal

#: the values of ``--security``
SECURITY_MODES = ("none", "scram-tls")
SECURITY_DIR = "security"
LISTENER = "SASL_SSL"
MECHANISM = "SCRAM-SHA-512"
USERNAME = "deltamirror"
SCRAM_ITERATIONS = 8192
CA_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
KEYSTORE_FILE = "server.p12"
KEYSTORE_PASSWORD_FILE = "keystore-password"
PASSWORD_FILE = "scram-password"
CLIENT_CONFIG_FILE = "kafka-client.yaml"
CERT_DAYS = 3650
SECURE_READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SecureClientSettings:
    """What a client needs for the SASL_SSL listener; the password only as the file holding it."""

    bootstrap_servers: str
    ca_file: Path
    password_file: Path
    config_file: Path
    username: str = USERNAME
    security_protocol: str = LISTENER
    sasl_mechanism: str = MECHANISM

    def password(self) -> str:
        return self.password_file.read_text(encoding="utf-8").strip()

    def librdkafka_config(self) -> dict[str, str]:
        """The client configuration, the password revealed: for a client, never a log."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.username,
            "sasl.password": self.password(),
            "ssl.ca.location": str(self.ca_file),
        }

    def describe(self) -> list[str]:
        """The settings as lines for a person: the password by where it is, never its value."""
        return [
            f"bootstrap_servers: {self.bootstrap_servers}",
            f"security_protocol: {self.security_protocol}",
            f"sasl_mechanism: {self.sasl_mechanism}",
            f"sasl_username: {self.username}",
            f"sasl_password: (in {self.password_file})",
            f"ssl_ca_location: {self.ca_file}",
        ]


def security_dir(data_dir: Path) -> Path:
    return data_dir / SECURITY_DIR


def write_private(path: Path, text: str) -> None:
    """Created 0600 from the start: a secret is never readable by others, not even for a moment."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)


def read_or_create_secret(path: Path) -> str:
    """The secret kept in ``path``; a new random one, written there readable by the owner only,
    when the file is missing or empty."""
    if path.is_file():
        value = path.read_text(encoding="utf-8").strip()
        if value:
            return value
    value = secrets.token_urlsafe(24)
    write_private(path, value + "\n")
    return value


def _openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        raise EnvironmentMissingError(
            "--security scram-tls makes its TLS certificate with the openssl command: install openssl"
        )
    return found


def _run_openssl(args: list[str], cwd: Path) -> None:
    command = [_openssl(), *args]
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaError(f"openssl {args[0]} failed: {exc}", file=str(cwd)) from None
    if done.returncode != 0:
        # openssl never echoes -passout values; its complaint names the file or the option
        complaint = " ".join((done.stderr or done.stdout).split())[-300:]
        raise KafkaError(f"openssl {args[0]} failed: {complaint}", file=str(cwd))


def ensure_tls_material(data_dir: Path) -> tuple[Path, Path, str]:
    """The CA file, the broker's PKCS12 keystore and its password: made once, kept afterwards."""
    directory = security_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca, keystore = directory / CA_FILE, directory / KEYSTORE_FILE
    store_password = read_or_create_secret(directory / KEYSTORE_PASSWORD_FILE)
    if ca.is_file() and keystore.is_file():
        return ca, keystore, store_password
    with tempfile.TemporaryDirectory(dir=directory, prefix=".tls-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "server.ext").write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
            encoding="utf-8",
        )
        # fmt: off
        _run_openssl([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", str(CERT_DAYS),
            "-keyout", CA_KEY_FILE, "-out", CA_FILE, "-subj", "/CN=deltamirror local kafka CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ], tmp)
        _run_openssl([
            "req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=localhost",
        ], tmp)
        _run_openssl([
            "x509", "-req", "-in", "server.csr", "-CA", CA_FILE, "-CAkey", CA_KEY_FILE,
            "-set_serial", str(secrets.randbits(63)), "-sha256", "-days", str(CERT_DAYS),
            "-extfile", "server.ext", "-out", "server.pem",
        ], tmp)
        _run_openssl([
            "pkcs12", "-export", "-in", "server.pem", "-inkey", "server.key", "-certfile", CA_FILE,
            "-name", "localhost", "-out", KEYSTORE_FILE, "-passout", f"file:{directory / KEYSTORE_PASSWORD_FILE}",
        ], tmp)
        # fmt: on
        for name in (CA_KEY_FILE, KEYSTORE_FILE):
            os.chmod(tmp / name, 0o600)
        # the keystore last: its presence says the set is complete
        for name in (CA_KEY_FILE, CA_FILE, KEYSTORE_FILE):
            os.replace(tmp / name, directory / name)
    return ca, keystore, store_password


def listener_properties(keystore: Path, store_password: str) -> dict[str, str]:
    """server.properties entries of the SASL_SSL listener (its address is the caller's)."""
    prefix = f"listener.name.{LISTENER.lower()}"
    return {
        "sasl.enabled.mechanisms": MECHANISM,
        f"{prefix}.{MECHANISM.lower()}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        f"{prefix}.ssl.keystore.type": "PKCS12",
        f"{prefix}.ssl.keystore.location": str(keystore),
        f"{prefix}.ssl.keystore.password": store_password,
        f"{prefix}.ssl.key.password": store_password,
        f"{prefix}.ssl.client.auth": "none",
    }


def client_settings(data_dir: Path, secure_bootstrap: str) -> SecureClientSettings:
    directory = security_dir(data_dir)
    return SecureClientSettings(
        bootstrap_servers=secure_bootstrap,
        ca_file=directory / CA_FILE,
        password_file=directory / PASSWORD_FILE,
        config_file=directory / CLIENT_CONFIG_FILE,
    )


def kafka_section_yaml(kafka: KafkaSettings, *, header: str = "") -> str:
    """A configuration file's ``kafka:`` section holding ``kafka``, secrets revealed (write it
    private): dumped from the settings model, so ``load_kafka_settings`` reads back the same."""
    import yaml

    section = reveal(kafka.model_dump(exclude_none=True, exclude_defaults=True))
    return header + yaml.safe_dump({"kafka": section}, sort_keys=False, allow_unicode=True)


def write_client_config(settings: SecureClientSettings) -> None:
    """``kafka-client.yaml``: the ``kafka:`` section every command's ``--config`` reads (mode 0600)."""
    kafka = KafkaSettings(
        bootstrap_servers=settings.bootstrap_servers,
        security_protocol=settings.security_protocol,
        sasl_mechanism=settings.sasl_mechanism,
        sasl_username=settings.username,
        sasl_password=SecretStr(settings.password()),
        ssl_ca_location=str(settings.ca_file),
    )
    header = (
        "# The local broker's SASL_SSL listener, for --config (written by deltamirror local kafka start).\n"
        "# Copy the kafka: section into a watch configuration; it holds the password: keep it private.\n"
    )
    write_private(settings.config_file, kafka_section_yaml(kafka, header=header))


def upsert_scram_user(plaintext_bootstrap: str, settings: SecureClientSettings) -> None:
    """Create (or reset) the SCRAM user over the PLAINTEXT listener, then log in with it over TLS.

    The login proves the listener, the certificate and the credential before ``start`` returns;
    the broker applies a credential from the metadata log a moment after the controller took it.
    """
    from confluent_kafka.admin import (  # heavy import, only needed here
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from deltamirror.mirror.kafka import clients

    password = read_or_create_secret(settings.password_file)
    admin = clients.admin({"bootstrap.servers": plaintext_bootstrap, "log_level": 0})
    upsert = UserScramCredentialUpsertion(
        settings.username,
        ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
        password.encode(),
        secrets.token_bytes(16),
    )
    try:
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
    except Exception as exc:  # librdkafka's KafkaException: its text never holds the password
        raise KafkaError(f"creating the SCRAM user {settings.username} failed: {exc}") from None
    write_client_config(settings)
    _wait_for_login(settings)


def _wait_for_login(settings: SecureClientSettings, timeout: float = SECURE_READY_TIMEOUT_S) -> None:
    from deltamirror.mirror.kafka import clients

    errors: list[str] = []

    def on_error(err: object) -> None:
        errors.append(str(getattr(err, "str", lambda: err)()))

    config: dict[str, Any] = {**settings.librdkafka_config(), "log_level": 0, "error_cb": on_error}
    admin = clients.admin(config)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # authentication not applied yet, timeouts
            if admin.list_topics(timeout=2.0).brokers:
                return
        admin.poll(0)  # serves error_cb: the reason, should it never work
        time.sleep(0.2)
    last = errors[-1] if errors else "no answer"
    raise KafkaError(
        f"the SASL_SSL listener at {settings.bootstrap_servers} refused the local user for "
        f"{timeout:.0f} s: {last}"
    )


def check_mode(security: str) -> str:
    if security not in SECURITY_MODES:
        raise ConfigError(f"--security must be one of {', '.join(SECURITY_MODES)}")
    return security


__all__ = [
    "LISTENER",
    "MECHANISM",
    "SECURITY_MODES",
    "USERNAME",
    "SecureClientSettings",
    "check_mode",
    "client_settings",
    "ensure_tls_material",
    "kafka_section_yaml",
    "listener_properties",
    "read_or_create_secret",
    "upsert_scram_user",
    "write_client_config",
    "write_private",
]
