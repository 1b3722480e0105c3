"""Whether a storage error is the storage refusing us (access denied, credentials it does not take).

Such an error does not pass with time, unlike a store that is down or a timeout: a command that
meets it at start refuses to start, naming the table and its storage options. The storage
libraries say it in their own ways, all recognised here without importing any of them: fsspec's
convention (``PermissionError``: s3fs maps ``AccessDenied``, ``InvalidAccessKeyId``,
``SignatureDoesNotMatch``, ``ExpiredToken``, HTTP 403 to it), an HTTP status 401 or 403 on the
exception (gcsfs, aiohttp, azure), or an exception class that names missing or refused
credentials (botocore's ``NoCredentialsError``, azure's ``ClientAuthenticationError``, google-auth's
``RefreshError``). Wrapped errors (``raise ... from``) are looked through.
"""

from __future__ import annotations

from ..redact import redact

#: HTTP statuses of a refusal: unauthenticated, forbidden
_REFUSED_STATUSES = frozenset({401, 403})
#: exception classes (by name: the libraries are optional) saying the credentials are refused or missing
_REFUSED_CLASSES = frozenset(
    {
        "NoCredentialsError",  # botocore
        "PartialCredentialsError",  # botocore
        "ClientAuthenticationError",  # azure.core
        "RefreshError",  # google.auth
        "DefaultCredentialsError",  # google.auth
    }
)
#: how deep a chain of causes is followed
_MAX_CHAIN = 8


def _status(exc: BaseException) -> int | None:
    for name in ("status", "status_code", "code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def storage_refusal(exc: BaseException) -> str | None:
    """What the storage said when it refused the request (redacted, one line), or None when
    ``exc`` is another kind of error (not found, down, a timeout: possibly transient)."""
    seen: BaseException | None = exc
    for _ in range(_MAX_CHAIN):
        if seen is None:
            return None
        if (
            isinstance(seen, PermissionError)
            or _status(seen) in _REFUSED_STATUSES
            or type(seen).__name__ in _REFUSED_CLASSES
        ):
            said = " ".join(str(seen).split()) or type(seen).__name__
            return redact(f"{type(seen).__name__}: {said}")[:300]
        seen = seen.__cause__ or seen.__context__
    return None


__all__ = ["storage_refusal"]
