"""Secrets out of everything deltamirror prints: log lines, error messages, metric labels.

Credentials reach deltamirror inside ordinary values: a table URI with userinfo
(``s3://key:secret@bucket/t``), an ``endpoint_url`` of ``http://user:pass@host``, a SAS token in a
query string, a ``password=...`` pair a library put in its error message. Masking only the fields
we know are secrets misses all of these, so every text that leaves the process goes through
:func:`redact`, which knows the *shapes* secrets take:

- the userinfo of any URL, whatever its scheme, wherever it is in the text (``s3://***@bucket``);
  also ``user:pass@host`` without a scheme (a broker list, an error message quoting one);
- the value of any key that names a secret (:func:`is_secret_key`) in ``key=value`` pairs
  (kwargs, query strings) and in quoted ``"key": value`` pairs (JSON, Python reprs).

:func:`redact_value` does the same for structured data (a config dump, kwargs): values under secret
keys become ``***``, strings are redacted as text. :class:`RedactingFilter` applies :func:`redact`
to log records, for handlers whose formatter does not.

Only the standard library is used: core may not import anything else, and the CLI calls this on
its error path.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Mapping
from typing import Any

MASK = "***"

# Keys whose value is a secret. Over-masking is cheap, a leak is not: ``key`` catches access keys,
# account keys, ``ssl.key.pem``, ``keystore``; ``sas``/``sig`` catch Azure SAS tokens and their
# query-string signature; ``sasl.*`` every librdkafka SASL property. Paths are not secrets: a key
# ending in ``location`` (``ssl.key.location``) stays readable, so operators can check their setup;
# nor are column names: ``key_columns`` (a row's key) is a list of them.
_SECRET_KEY = re.compile(
    r"passw|pwd|secret|token|credential|private|jaas|auth|key|connection.?string"
    r"|(?:^|[^a-z])sas(?:[^a-z]|$)|(?:^|[^a-z])sig(?:nature)?(?:[^a-z]|$)|^sasl\.",
    re.IGNORECASE,
)


def is_secret_key(key: object) -> bool:
    """True when the value of ``key`` (a config key, a kwarg, a query parameter) is a secret."""
    if not isinstance(key, str):
        return False
    name = key.strip().strip("\"'").lower()
    return _SECRET_KEY.search(name) is not None and not name.endswith(("location", "columns"))


# scheme://userinfo@ -- userinfo without '/' (the usual case), or with a ':' in it, up to the last
# '@' of the word: an unescaped '/' or '@' in a password (AWS secret keys hold '/') is still masked.
# The next URL of a comma-separated list is a word of its own.
_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<userinfo>[^\s\"'<>/?#@]*:(?:(?!,[A-Za-z][A-Za-z0-9+.\-]*://)[^\s\"'<>])*|[^\s\"'<>/?#@]+)@"
)
# user:pass@host with no scheme (a bootstrap server list, an error message quoting one)
_BARE_USERINFO = re.compile(r"(?<![\w.+~%/:@-])[\w.+~%-]+:(?!//)[^\s\"'<>,;]*@(?=[\w\[])")
# a quoted value, or a bare one up to a separator; a quote ends it only where a closing quote would
# (``"x": "password=abc"`` keeps its JSON quote, ``password=ab"c`` is masked whole)
_VALUE = r"(?:\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|(?:[^\s,;&)}\]\"']|[\"'](?![\s,;&)}\]:]|$))+)"
# "key": value / 'key'=value (JSON, reprs of dicts)
_QUOTED_PAIR = re.compile(
    rf"(?P<q>[\"'])(?P<key>[^\"'\s]{{1,128}})(?P=q)(?P<sep>\s*[:=]\s*)(?P<value>{_VALUE})"
)
# key=value (kwargs, query strings, librdkafka properties in a message); not "key: value", which is
# how our own messages name a config key ("kafka.sasl_password: required ...")
_PLAIN_PAIR = re.compile(
    rf"(?<![\w.\-])(?P<key>[A-Za-z_][\w.\-]{{0,127}})(?P<sep>\s*=\s*)(?P<value>{_VALUE})"
)


#: values that are not secrets whatever their key says (a JSON dump of an unset password)
_NOT_A_SECRET = frozenset({"", "null", "none", "true", "false", MASK, "**********"})


def _mask_pair(match: re.Match[str]) -> str:
    value = match["value"]
    start = match.start("value") - match.start()
    if not is_secret_key(match["key"]):
        # the value may hold pairs of its own: ``file=t?sig=...``, ``url=http://h/?token=...``
        return match.group(0)[:start] + _PLAIN_PAIR.sub(_mask_pair, value)
    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"
    if (value[1:-1] if quoted else value).lower() in _NOT_A_SECRET:
        return match.group(0)
    # a quoted key is JSON or a repr: keep the text parseable with a quoted mask
    quote = value[0] if quoted else (match.groupdict().get("q") or "")
    return f"{match.group(0)[:start]}{quote}{MASK}{quote}"


def redact(text: str) -> str:
    """``text`` with URL userinfo and the values of secret-named keys replaced by ``***``."""
    if not text:
        return text
    if "@" in text:
        text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
        text = _BARE_USERINFO.sub(f"{MASK}@", text)
    # a quoted pair needs a quote and a ``:`` or ``=``, a plain one an ``=``: a URI's ``:`` alone
    # (every table's name in every log line) matches neither
    if "=" in text or (":" in text and ('"' in text or "'" in text)):
        text = _QUOTED_PAIR.sub(_mask_pair, text)
        text = _PLAIN_PAIR.sub(_mask_pair, text)
    return text


def redact_value(value: Any, key: object = None) -> Any:
    """``value`` (dicts, lists, strings, anything else) fit for a log: see the module docstring.

    A value under a secret key becomes ``***`` whatever it is (a gcsfs ``token`` may be a dict);
    other strings go through :func:`redact`; objects that are neither are shown by their ``str``,
    redacted (pydantic's ``SecretStr`` already shows ``**********``).
    """
    if key is not None and is_secret_key(key) and value is not None and value != "":
        return MASK
    if isinstance(value, Mapping):
        return {k: redact_value(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value))


_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class RedactingFilter(logging.Filter):
    """Redacts a record in place: its message, its extra fields and its exception text.

    Attach it to a *handler* (``handler.addFilter``): a logger's filters do not see the records of
    its children, a handler's see every record it writes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        for name, value in list(vars(record).items()):
            if name in _RECORD_ATTRS or name.startswith("_"):
                continue
            if isinstance(value, str):
                setattr(record, name, redact(value))
            elif isinstance(value, Mapping | list | tuple):
                setattr(record, name, redact_value(value, name))
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install_redaction(logger: logging.Logger | str = "deltamirror") -> None:
    """Add a :class:`RedactingFilter` to every handler of ``logger`` that has none yet."""
    target = logging.getLogger(logger) if isinstance(logger, str) else logger
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


__all__ = ["MASK", "RedactingFilter", "install_redaction", "is_secret_key", "redact", "redact_value"]
