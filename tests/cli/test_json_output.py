"""jsonl output prints every valid JSON value the log may hold in its free-form fields."""

from __future__ import annotations

import json

from deltamirror.cli.output import dumps


def test_integers_beyond_64_bits_print_as_the_log_has_them() -> None:
    """commitInfo is free-form: "any valid JSON" (PROTOCOL.md), and 10**30 is valid JSON."""
    out = dumps({"operationMetrics": {"rows": 10**30}, "n": 1})
    assert out == b'{"operationMetrics":{"rows":1000000000000000000000000000000},"n":1}'
    assert json.loads(out)["operationMetrics"]["rows"] == 10**30


def test_a_string_that_is_not_valid_unicode_is_escaped_not_dropped() -> None:
    out = dumps({"engineInfo": "x\ud800y"})
    assert out == b'{"engineInfo":"x\\ud800y"}'


def test_the_fast_path_and_the_fallback_agree_on_ordinary_values() -> None:
    value = {"a": [1, 2.5, None, True], "b": {"c": "d"}, "e": "ü"}
    fast = json.loads(dumps(value))
    slow = json.loads(dumps({**value, "big": 2**64}))
    assert slow.pop("big") == 2**64 and slow == fast == value
