"""Local opens through a held folder: one openat per file, never relative to a folder that moved.

The folder of a file is held open once its real path was checked inside the root; these tests
change the folders under a storage that already holds them (renamed, deleted, swapped for a link
out of the root), read from many folders on many threads, and put a FIFO where a file should be.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltamirror.core.errors import PathOutsideTableError
from deltamirror.core.storage import TableStorage, local

pytestmark = pytest.mark.skipif(not local._PROC_FD, reason="the held-folder path is Linux's (/proc/self/fd)")


def _storage(root: Path) -> TableStorage:
    (root / "_delta_log").mkdir(parents=True, exist_ok=True)
    return TableStorage(str(root))


def test_a_folder_renamed_or_deleted_after_a_read_is_opened_anew(tmp_path: Path) -> None:
    root = tmp_path / "t"
    storage = _storage(root)
    commit = root / "_delta_log" / "00000000000000000000.json"
    commit.write_bytes(b"first\n")
    path = storage.log_file(commit.name)
    assert storage.read_bytes(path) == b"first\n"

    (root / "_delta_log").rename(root / "_delta_log.old")  # still inside the root
    (root / "_delta_log").mkdir()
    commit.write_bytes(b"second\n")
    assert storage.read_bytes(path) == b"second\n"

    shutil.rmtree(root / "_delta_log")
    (root / "_delta_log").mkdir()
    commit.write_bytes(b"third\n")
    assert storage.read_bytes(path) == b"third\n"


def test_a_held_folder_swapped_for_a_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "t", tmp_path / "outside"
    storage = _storage(root)
    (root / "part=1").mkdir()
    (root / "part=1" / "f.bin").write_bytes(b"inside")
    (outside / "part=1").mkdir(parents=True)
    (outside / "part=1" / "f.bin").write_bytes(b"SECRET")
    path = storage.resolve("part=1/f.bin")
    assert storage.read_bytes(path) == b"inside"

    (root / "part=1").rename(root / "part=1.old")
    (root / "part=1").symlink_to(outside / "part=1", target_is_directory=True)
    with pytest.raises(PathOutsideTableError, match="symbolic link"):
        storage.read_bytes(path)
    with pytest.raises(PathOutsideTableError):
        storage.open(path)


def test_a_file_that_is_a_link_inside_the_root_is_still_read(tmp_path: Path) -> None:
    """O_NOFOLLOW sends a link the long way, which resolves it: a link within the root is fine."""
    root = tmp_path / "t"
    storage = _storage(root)
    (root / "real.bin").write_bytes(b"data")
    (root / "alias.bin").symlink_to(root / "real.bin")
    assert storage.read_bytes(storage.resolve("real.bin")) == b"data"
    assert storage.read_bytes(storage.resolve("alias.bin")) == b"data"


def test_many_folders_on_many_threads_read_their_own_files_and_hold_few_descriptors(tmp_path: Path) -> None:
    """More folders than are held (each time the map fills, all are let go while other threads
    read): a thread must never open relative to a descriptor closed and reused meanwhile."""
    root = tmp_path / "t"
    storage = _storage(root)
    folders = local.FOLDER_HANDLES * 2 + 7
    for i in range(folders):
        (root / f"p={i}").mkdir()
        (root / f"p={i}" / "f.bin").write_bytes(f"folder {i}".encode())
    wrong: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(1500):
            i = rng.randrange(folders)
            got = storage.read_bytes(storage.resolve(f"p={i}/f.bin"))
            if got != f"folder {i}".encode():
                wrong.append(f"p={i}: {got!r}")

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert wrong == []
    assert len(_fds_into(root)) <= local.FOLDER_HANDLES
    storage._local.close()
    assert _fds_into(root) == []


def test_the_process_holds_at_most_its_share_of_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of tables in one watcher: past the process's budget, files are opened the long
    way (correctly, without holding their folder), and a table that lets go gives its share back."""
    monkeypatch.setattr(local, "PROCESS_FOLDER_HANDLES", local._process_held + 3)
    roots = [tmp_path / "a", tmp_path / "b"]
    storages = [_storage(root) for root in roots]
    for root in roots:
        for i in range(5):
            (root / f"p={i}").mkdir()
            (root / f"p={i}" / "f.bin").write_bytes(f"{root.name}{i}".encode())
    for _ in range(2):
        for root, storage in zip(roots, storages, strict=True):
            for i in range(5):
                assert storage.read_bytes(storage.resolve(f"p={i}/f.bin")) == f"{root.name}{i}".encode()
    assert len(_fds_into(tmp_path)) == 3
    assert _fds_into(roots[1]) == []  # the first table took the three
    storages[0]._local.close()
    assert _fds_into(tmp_path) == []
    storages[1].read_bytes(storages[1].resolve("p=0/f.bin"))
    assert len(_fds_into(roots[1])) == 1


def _fds_into(folder: Path) -> list[str]:
    """The descriptors of this process open on ``folder`` or below it."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if target == str(folder) or target.startswith(f"{folder}/"):
            out.append(target)
    return out


def test_held_folders_are_closed_when_the_storage_is_collected(tmp_path: Path) -> None:
    import gc

    root = tmp_path / "t"
    for i in range(10):
        (root / f"p={i}").mkdir(parents=True)
        (root / f"p={i}" / "f.bin").write_bytes(b"x")
    storage = _storage(root)
    for i in range(10):
        storage.read_bytes(storage.resolve(f"p={i}/f.bin"))
    assert len(_fds_into(root)) == 10  # the ten folders, held
    del storage
    gc.collect()
    assert _fds_into(root) == []


def test_a_fifo_or_a_folder_where_a_file_should_be_is_refused_without_hanging(tmp_path: Path) -> None:
    """Only regular files are read: a FIFO opened for reading would wait for a writer forever."""
    from deltamirror.core.errors import CorruptDataFileError, StorageAccessError
    from deltamirror.core.read import open_parquet

    root = tmp_path / "t"
    storage = _storage(root)
    os.mkfifo(root / "_delta_log" / "00000000000000000000.json")
    os.mkfifo(root / "fifo.parquet")
    (root / "folder.parquet").mkdir()
    (root / "alias.parquet").symlink_to(root / "fifo.parquet")  # the long way, through the link
    outcome: dict[str, object] = {}

    def read() -> None:
        try:
            storage.read_bytes(storage.log_file("00000000000000000000.json"))
        except StorageAccessError as exc:
            outcome["commit"] = str(exc)
        for name in ("fifo", "folder", "alias"):
            try:
                open_parquet(storage, f"{name}.parquet")
            except CorruptDataFileError as exc:
                outcome[name] = str(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "a FIFO hung the reader"
    assert "not a regular file" in str(outcome["commit"]) and "00000000000000000000.json" in str(
        outcome["commit"]
    )
    for name in ("fifo", "folder", "alias"):
        assert "is not a regular file" in str(outcome[name]) and f"{name}.parquet" in str(outcome[name])


@pytest.mark.parametrize(
    "whole_up_to", [0, local.WHOLE_PARQUET_BYTES], ids=["through-the-file", "read-whole"]
)
def test_parquet_read_whole_or_through_the_file_gives_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole_up_to: int
) -> None:
    root = tmp_path / "t"
    storage = _storage(root)
    table = pa.table({"id": list(range(50_000)), "s": [f"row {i}" for i in range(50_000)]})
    pq.write_table(table, root / "f.parquet", row_group_size=7_000)
    monkeypatch.setattr(local, "WHOLE_PARQUET_BYTES", whole_up_to)
    pf = storage.parquet_file(storage.resolve("f.parquet"))
    try:
        assert pf.metadata.num_row_groups == 8
        assert (
            pa.Table.from_batches(list(pf.iter_batches(columns=["s", "id"])))
            .select(["id", "s"])
            .equals(table)
        )
    finally:
        pf.close()
