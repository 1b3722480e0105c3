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
