"""The watcher's log handler writes to the stderr of the moment."""

from __future__ import annotations

import contextlib
import io
import json
import logging

import pytest

from deltamirror.producer.log_format import configure_logging


def test_logs_go_to_the_current_stderr_after_the_one_at_setup_was_closed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A command run in-process under a swapped stderr (a test's capture) set up its handler there;
    once that stream is closed, a later record must reach the stderr of then, not fail on a closed
    file ("--- Logging error --- ValueError: I/O operation on closed file")."""
    swapped = io.StringIO()
    with contextlib.redirect_stderr(swapped):
        configure_logging(logging.WARNING)
    swapped.close()
    logging.getLogger("deltamirror.test").warning("after the swap")
    err = capsys.readouterr().err
    assert "Logging error" not in err
    assert json.loads(err.splitlines()[-1])["msg"] == "after the swap"


def test_the_starting_line_is_json_with_only_the_secrets_masked() -> None:
    """Audit F13: ``key_columns`` was taken for a secret (it holds ``key``) and the text redaction
    of the logged JSON cut its list, ``"key_columns": "***""]``: the line's config was not JSON."""
    from deltamirror.producer.config_file import redacted
    from deltamirror.producer.settings import validate_watch_config

    cfg = validate_watch_config(
        {
            "kafka": {
                "bootstrap_servers": "b:9092",
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password": "pw-Secret-4411",
            },
            "tables": [
                {
                    "uri": "/t",
                    "row_changes": {
                        "key_columns": ["id", "region"],
                        "mask": {"email": "hmac"},
                        "mask_key": "mask-Secret-77889900",
                    },
                }
            ],
        },
        None,
    )
    stream = io.StringIO()
    configure_logging(logging.INFO, stream=stream)
    try:
        logging.getLogger("deltamirror.producer.service").info(
            "starting", extra={"config": json.dumps(redacted(cfg), default=str)}
        )
    finally:
        configure_logging(logging.WARNING)
    text = stream.getvalue()
    assert "Secret" not in text
    config = json.loads(json.loads(text.splitlines()[-1])["config"])
    row_changes = config["tables"][0]["row_changes"]
    assert row_changes["key_columns"] == ["id", "region"]
    assert row_changes["mask_key"] == "***"
    assert config["kafka"]["sasl_password"] == "***"
