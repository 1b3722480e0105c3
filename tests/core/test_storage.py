"""TableStorage retries transient storage errors and passes permanent ones at once."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from deltamirror.core.errors import StorageError
from deltamirror.core.storage import TableStorage


class _FailingFileSystem(LocalFileSystem):
    """Local files whose next ``fail_next`` calls raise ``error``."""

    protocol = "failingfs"
    fail_next = 0
    error: type[BaseException] = TimeoutError
    calls = 0

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        path = str(path)
        if path.startswith("failingfs://"):
            path = path[len("failingfs://") :]
        return super()._strip_protocol(path)

    def _maybe_fail(self) -> None:
        type(self).calls += 1
        if type(self).fail_next > 0:
            type(self).fail_next -= 1
            raise type(self).error("injected")

    def cat_file(self, path: Any, start: Any = None, end: Any = None, **kw: Any) -> Any:
        self._maybe_fail()
        return super().cat_file(path, start=start, end=end, **kw)

    def ls(self, path: Any, detail: bool = False, **kw: Any) -> Any:
        self._maybe_fail()
        return super().ls(path, detail=detail, **kw)


@pytest.fixture
def failing(tmp_path: Path) -> Any:
    fsspec.register_implementation("failingfs", _FailingFileSystem, clobber=True)
    (tmp_path / "_delta_log").mkdir()
    (tmp_path / "_delta_log" / "00000000000000000000.json").write_text("{}\n")
    _FailingFileSystem.fail_next = 0
    _FailingFileSystem.calls = 0
    _FailingFileSystem.error = TimeoutError
    return tmp_path


def test_transient_errors_are_retried(failing: Path) -> None:
    storage = TableStorage(f"failingfs://{failing}", backoff_s=0.001)
    _FailingFileSystem.fail_next = storage.attempts - 1
    assert storage.read_bytes(storage.log_file("00000000000000000000.json")) == b"{}\n"
    assert _FailingFileSystem.calls == storage.attempts
    _FailingFileSystem.fail_next = storage.attempts - 1
    assert [f.name for f in storage.list_log()] == ["00000000000000000000.json"]


def test_persistent_errors_fail_naming_the_file_and_attempts(failing: Path) -> None:
    storage = TableStorage(f"failingfs://{failing}", attempts=3, backoff_s=0.001)
    _FailingFileSystem.fail_next = 3
    path = storage.log_file("00000000000000000000.json")
    with pytest.raises(StorageError, match="after 3 attempts") as info:
        storage.read_bytes(path)
    assert info.value.file == path
    assert _FailingFileSystem.calls == 3


def test_permanent_errors_are_not_retried(failing: Path) -> None:
    storage = TableStorage(f"failingfs://{failing}", backoff_s=0.001)
    _FailingFileSystem.fail_next = 1
    _FailingFileSystem.error = PermissionError
    with pytest.raises(StorageError):
        storage.read_bytes(storage.log_file("00000000000000000000.json"))
    assert _FailingFileSystem.calls == 1
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.log_file("00000000000000000001.json"))


def test_retry_settings_survive_pickling(failing: Path) -> None:
    storage = TableStorage(f"failingfs://{failing}", attempts=7, backoff_s=0.5)
    copy = pickle.loads(pickle.dumps(storage))
    assert (copy.attempts, copy.backoff_s, copy.uri) == (7, 0.5, storage.uri)
