"""The secured listener's material and configuration, without starting a broker."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from deltamirror.core.errors import ConfigError
from deltamirror.devkafka.broker import SERVER_PROPERTIES, LocalKafka, _read_properties
from deltamirror.devkafka.security import ensure_tls_material


def _openssl(*args: str) -> str:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_the_ca_signs_a_server_certificate_for_127_0_0_1_made_once(tmp_path: Path) -> None:
    ca, keystore, password = ensure_tls_material(tmp_path)
    security = tmp_path / "security"
    assert stat.S_IMODE(security.stat().st_mode) == 0o700
    for private in ("ca.key", "server.p12", "keystore-password"):
        assert stat.S_IMODE((security / private).stat().st_mode) == 0o600, private
    assert (security / "keystore-password").read_text().strip() == password
    # the keystore opens with its password and holds the server's certificate, signed by the CA
    server_pem = tmp_path / "server.pem"
    server_pem.write_text(
        _openssl("pkcs12", "-in", str(keystore), "-clcerts", "-nokeys", "-passin", f"pass:{password}")
    )
    assert _openssl("verify", "-CAfile", str(ca), str(server_pem)).strip().endswith(": OK")
    text = _openssl("x509", "-in", str(server_pem), "-noout", "-text")
    assert "IP Address:127.0.0.1" in text and "DNS:localhost" in text
    assert "TLS Web Server Authentication" in text
    # kept: the clients' CA file stays valid across starts
    before = ca.read_bytes(), keystore.read_bytes()
    assert ensure_tls_material(tmp_path) == (ca, keystore, password)
    assert (ca.read_bytes(), keystore.read_bytes()) == before


def test_the_secured_config_adds_a_sasl_ssl_listener_beside_plaintext(tmp_path: Path) -> None:
    broker = LocalKafka(port=29092, data_dir=tmp_path, security="scram-tls")
    broker._write_config(29093, 29094)
    props = _read_properties(tmp_path / SERVER_PROPERTIES)
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093,SASL_SSL://127.0.0.1:29094"
    )
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092,SASL_SSL://127.0.0.1:29094"
    assert (
        props["listener.security.protocol.map"]
        == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL"
    )
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["listener.name.sasl_ssl.ssl.keystore.type"] == "PKCS12"
    assert (
        stat.S_IMODE((tmp_path / SERVER_PROPERTIES).stat().st_mode) == 0o600
    )  # it holds the keystore's password
    assert broker.status()["secure_bootstrap_servers"] == "127.0.0.1:29094"
    assert broker.secure_client_settings() is not None

    plain = LocalKafka(port=29092, data_dir=tmp_path)
    plain._write_config(29093)
    assert "SASL_SSL" not in (tmp_path / SERVER_PROPERTIES).read_text()
    assert plain.secure_client_settings() is None


def test_bad_security_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--security must be one of none, scram-tls$"):
        LocalKafka(port=29092, data_dir=tmp_path, security="tls")
    broker = LocalKafka(port=29092, data_dir=tmp_path, security="scram-tls", secure_port=29092)
    with pytest.raises(ConfigError, match=r"^--secure-port 29092 is taken by the broker's own listeners"):
        broker.start()
