"""TableStorage retries transient storage errors and passes permanent ones at once."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from deltamirror.core.errors import StorageAccessError, StorageError
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
    with pytest.raises(StorageAccessError) as info:  # no retry changes a refusal: bad input, exit 2
        storage.read_bytes(storage.log_file("00000000000000000000.json"))
    assert _FailingFileSystem.calls == 1 and info.value.exit_code == 2
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.log_file("00000000000000000001.json"))


def test_retry_settings_survive_pickling(failing: Path) -> None:
    storage = TableStorage(f"failingfs://{failing}", attempts=7, backoff_s=0.5)
    copy = pickle.loads(pickle.dumps(storage))
    assert (copy.attempts, copy.backoff_s, copy.uri) == (7, 0.5, storage.uri)


@pytest.mark.parametrize("uri", ["local", "memory://clip-test/t"])
def test_byte_ranges_stop_at_the_end_of_the_file(tmp_path: Path, uri: str) -> None:
    """A range taken from the log (a DV's offset and size) never allocates past the file."""
    storage = TableStorage(str(tmp_path) if uri == "local" else uri)
    path = f"{storage.root}/f.bin"
    storage.fs.pipe_file(path, b"0123456789")
    assert storage.read_bytes(path, 2, 10**12) == b"23456789"
    assert storage.read_bytes(path, 10**12, 10**12 + 5) == b""
    assert storage.read_bytes(path) == b"0123456789"
    with pytest.raises(ValueError):
        storage.read_bytes(path, -1, 5)
    with pytest.raises(ValueError):
        storage.open(path, "wb")


def test_a_password_in_the_table_url_is_not_part_of_its_identity() -> None:
    """The identity is published (progress keys, envelopes) and printed; the credentials are only
    for opening the storage, so they travel with the object (pickling) but never show."""
    import pickle

    from deltamirror.core.storage import normalize_table_uri

    storage = TableStorage("s3://AKIAKEY:s3cr3t@bucket/events/")
    assert storage.uri == "s3://bucket/events" == normalize_table_uri("s3://AKIAKEY:s3cr3t@bucket/events")
    assert "s3cr3t" not in repr(storage)
    arrived = pickle.loads(pickle.dumps(storage))
    assert arrived.uri == "s3://bucket/events" and "s3cr3t" in arrived.__getstate__()["uri"]
    # a user part without a password names something (an Azure container): it stays
    azure = "abfs://container@account.dfs.core.windows.net/t"
    assert normalize_table_uri(azure) == azure


def test_a_request_storage_refuses_for_good_is_bad_input_not_retried(tmp_path: Path) -> None:
    """A ``_delta_log`` that is a file: no retry can help, so it is exit 2 at once, not 1."""
    (tmp_path / "_delta_log").write_text("not a folder")
    storage = TableStorage(str(tmp_path), attempts=4, backoff_s=30)  # a retry would take minutes
    with pytest.raises(StorageAccessError) as info:
        storage.read_bytes(storage.log_file("_last_checkpoint"))
    assert info.value.exit_code == 2 and "Not a directory" in str(info.value)


def test_a_local_files_time_is_the_same_listed_or_asked_alone(tmp_path: Path) -> None:
    """A listing and a file's own stat give one time, whole ns to ms (Hadoop's FileStatus ms):
    the listing took seconds as a float times 1000, rounded into the next ms for some stamps, and a version's
    commit timestamp was then resolved once as its file time and once as adjusted past the version
    before it (CI: test_events_of_every_real_table_follow_the_contract, files checked out in the
    same ms). The stamps here are ones the float rounds up into the next ms."""
    import os

    log = tmp_path / "_delta_log"
    log.mkdir()
    stamps = [1_796_013_591_895_999_999, 1_796_013_591_896_000_000, 1_700_000_000_123_999_999]
    for v, ns in enumerate(stamps):
        path = log / f"{v:020d}.json"
        path.write_text("{}\n")
        os.utime(path, ns=(ns, ns))
    float_ms = [int(os.stat(log / f"{v:020d}.json").st_mtime * 1000) for v in range(len(stamps))]
    assert float_ms != [ns // 1_000_000 for ns in stamps]  # the float path's error, on this system
    storage = TableStorage(str(tmp_path))
    listed = {f.name: f.modification_time for f in storage.list_dir(str(log))}
    for v, ns in enumerate(stamps):
        name = f"{v:020d}.json"
        assert listed[name] == ns // 1_000_000 == storage.info(str(log / name)).modification_time
