"""Which storage errors are the storage refusing us (refused at start) and which may pass (retried)."""

from __future__ import annotations

import pytest

from deltamirror.core.errors import StorageAccessError, StorageError
from deltamirror.core.storage import storage_refusal


class NoCredentialsError(Exception):  # botocore's, by name
    pass


class ClientAuthenticationError(Exception):  # azure.core's, by name
    pass


class HttpError(Exception):  # gcsfs's: an HTTP status on the exception
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise StorageAccessError("storage refused list", table="s3://b/t") from exc
    except StorageAccessError as outer:
        return outer


@pytest.mark.parametrize(
    "exc",
    [
        PermissionError("The request signature we calculated does not match the signature you provided"),
        NoCredentialsError("Unable to locate credentials"),
        ClientAuthenticationError("Server failed to authenticate the request"),
        HttpError("Forbidden", 403),
        HttpError("Unauthorized", 401),
        _wrapped(PermissionError("Access Denied")),
    ],
)
def test_refusals(exc: BaseException) -> None:
    said = storage_refusal(exc)
    assert said is not None and "\n" not in said


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError("Connection refused"),
        TimeoutError("timed out"),
        FileNotFoundError("no such key"),
        OSError("Service Unavailable"),
        HttpError("Service Unavailable", 503),
        StorageError("storage error during list (after 4 attempts)", table="s3://b/t"),
        _wrapped(ConnectionResetError("reset")),
    ],
)
def test_errors_that_may_pass(exc: BaseException) -> None:
    assert storage_refusal(exc) is None


def test_what_the_storage_said_is_redacted() -> None:
    said = storage_refusal(PermissionError("denied for s3://AKIA:hunter2@bucket/t"))
    assert said is not None and "hunter2" not in said and "PermissionError" in said
