"""Nothing outside the table root is read: every path trick in data, cdc and deletion-vector paths.

Each malicious table is a copy of a small real table whose commit JSON names a file by a trick
that leads out of the root. A copy of the table's own files waits out there (in a sibling folder,
in a sibling whose name extends the root's, in the working directory), so a reader that followed
the path would find a good file and print its rows: the bug these tests guard against. Every trick
must be refused with exit 2 and one line naming the path, through the library and the CLI, and an
inotify watch on the outside files proves that the operating system saw no open of any of them.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deltamirror.cli.main import main
from deltamirror.core.errors import DeletionVectorError, PathOutsideTableError
from deltamirror.core.storage import TableStorage
from deltamirror.core.table import open_table

TABLES = Path(__file__).resolve().parents[1] / "data" / "tables"
#: add/remove of one data file (with a 'u' deletion vector at versions 1-2), CDF enabled
DV_TABLE = "krs__cdf-table-with-dv"
DATA_FILE = "part-00000-fae5310a-a37d-4e51-827b-c3d5516560ca-c000.snappy.parquet"
DV_UUID = "61d16c75-6994-46b7-a15b-8b538852e50e"
DV_FILE = f"deletion_vector_{DV_UUID}.bin"
#: a cdc file at version 2
CDC_TABLE = "drs__simple_table_with_cdc"
CDC_FILE = "_change_data/cdc-00000-a846ce80-2eec-484d-bef7-0e63557786ca.c000.snappy.parquet"

from support.z85 import z85_encode as z85  # noqa: E402

DV_ID = z85(uuid.UUID(DV_UUID).bytes)


# --- the scene: a table, and copies of its files outside it ---------------------------------------


class Scene:
    """``<tmp>/t/tbl`` (the table), ``<tmp>/t/outside`` and ``<tmp>/t/tbl2`` (copies of its files),
    ``<tmp>/cwd/other-bucket`` (a copy where an ``s3://other-bucket/`` path lands if resolved against
    the working directory), symbolic links inside the root that point out."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.base = tmp / "t"
        self.root = self.base / "tbl"
        shutil.copytree(TABLES / name, self.root)
        self.outside = self.base / "outside"
        self.sibling = self.base / "tbl2"
        self.cwd = tmp / "cwd"
        self.bucket = self.cwd / "other-bucket"
        for copy in (self.outside, self.sibling, self.bucket):
            shutil.copytree(self.root, copy, ignore=shutil.ignore_patterns("_delta_log"))
        (self.root / "link").symlink_to(self.outside, target_is_directory=True)

    def tricks(self, rel: str) -> dict[str, str]:
        """Ways to name ``rel``'s copy outside the root (``rel``: a path relative to the root)."""
        name = rel.rsplit("/", 1)[-1]
        evil = self.root / f"evil-{name}"
        if not evil.is_symlink():
            evil.symlink_to(self.outside / rel)
        return {
            "dotdot": f"../outside/{rel}",
            "encoded-dots": f"%2e%2e/outside/{rel}",
            "encoded-slash": "..%2Foutside%2F" + rel.replace("/", "%2F"),
            "encoded-slash-dotdot": f"_delta_log%2F..%2F..%2Foutside/{rel}",
            "absolute": f"{self.outside}/{rel}",
            "file-uri": f"file://{self.outside}/{rel}",
            "file-colon": f"file:{self.outside}/{rel}",
            "file-other-host": f"file://other-host{self.root}/{rel}",
            "s3-other-bucket": f"s3://other-bucket/{rel}",
            "prefix-sibling-absolute": f"{self.sibling}/{rel}",
            "prefix-sibling-uri": f"file://{self.sibling}/{rel}",
            "prefix-sibling-relative": f"../tbl2/{rel}",
            "symlinked-folder": f"link/{rel}",
            "symlinked-file": f"evil-{name}",
            "etc-passwd": "/etc/passwd",
        }

    def watched_folders(self) -> list[Path]:
        folders = [self.outside, self.sibling, self.bucket]
        return [p for f in folders for p in (f, *(d for d in f.rglob("*") if d.is_dir()))]

    def rewrite(self, edit: Callable[[str, dict[str, Any]], None]) -> None:
        """Apply ``edit(kind, action)`` to every add/remove/cdc action of every commit."""
        for commit in sorted((self.root / "_delta_log").glob("*.json")):
            lines = []
            for line in commit.read_text().splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                for kind in ("add", "remove", "cdc"):
                    if kind in action:
                        edit(kind, action[kind])
                lines.append(json.dumps(action))
            commit.write_text("\n".join(lines) + "\n")


def set_path(old: str, new: str) -> Callable[[str, dict[str, Any]], None]:
    def edit(kind: str, action: dict[str, Any]) -> None:
        if action["path"] == old:
            action["path"] = new

    return edit


def set_dv(storage_type: str, value: str) -> Callable[[str, dict[str, Any]], None]:
    def edit(kind: str, action: dict[str, Any]) -> None:
        dv = action.get("deletionVector")
        if dv and dv["storageType"] == "u":
            dv["storageType"], dv["pathOrInlineDv"] = storage_type, value

    return edit


# --- watching the outside files at the operating-system level -------------------------------------

IN_ACCESS, IN_OPEN = 0x1, 0x20


class Inotify:
    """Linux inotify through ctypes: the opens and reads of any file in the watched folders."""

    def __init__(self, folders: list[Path]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            pytest.skip("inotify is not available")
        self._names: dict[int, Path] = {}
        for folder in folders:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(folder), IN_OPEN | IN_ACCESS)
            assert wd >= 0, f"cannot watch {folder}"
            self._names[wd] = folder

    def events(self) -> list[str]:
        found = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            i = 0
            while i < len(buf):
                wd, mask, _, length = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16 : i + 16 + length].rstrip(b"\0").decode()
                found.append(f"{self._names[wd] / name} {'open' if mask & IN_OPEN else 'read'}")
                i += 16 + length

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def watch() -> Iterator[Callable[[Scene], Inotify]]:
    if not sys.platform.startswith("linux"):
        pytest.skip("inotify is Linux only")
    opened: list[Inotify] = []

    def start(scene: Scene) -> Inotify:
        opened.append(Inotify(scene.watched_folders()))
        return opened[-1]

    yield start
    for w in opened:
        w.close()


# --- running a read through the library and the CLI ----------------------------------------------


def library_read(root: Path, version: int | None, allowed: tuple[str, ...] = ()) -> int:
    return open_table(str(root), allowed_path_prefixes=allowed).snapshot(version).to_arrow().num_rows


def library_changes(root: Path, start: int, end: int, allowed: tuple[str, ...] = ()) -> int:
    table = open_table(str(root), allowed_path_prefixes=allowed)
    return table.changes(starting_version=start, ending_version=end).to_arrow().num_rows


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused_line(code: int, out: str, err: str, shown: str) -> None:
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("deltamirror: error: "), err
    assert "Traceback" not in err
    assert shown in err, err


# --- data files ------------------------------------------------------------------------------------

TRICK_NAMES = [
    "dotdot",
    "encoded-dots",
    "encoded-slash",
    "encoded-slash-dotdot",
    "absolute",
    "file-uri",
    "file-colon",
    "file-other-host",
    "s3-other-bucket",
    "prefix-sibling-absolute",
    "prefix-sibling-uri",
    "prefix-sibling-relative",
    "symlinked-folder",
    "symlinked-file",
    "etc-passwd",
]


@pytest.mark.parametrize("trick", TRICK_NAMES)
def test_data_file_path_tricks_are_refused(
    trick: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    watch: Callable[[Scene], Inotify],
) -> None:
    scene = Scene(tmp_path, DV_TABLE)
    monkeypatch.chdir(scene.cwd)
    bad = scene.tricks(DATA_FILE)[trick]
    scene.rewrite(set_path(DATA_FILE, bad))
    seen = watch(scene)
    with pytest.raises(PathOutsideTableError) as info:
        library_read(scene.root, None)
    assert info.value.exit_code == 2
    with pytest.raises(PathOutsideTableError):
        library_changes(scene.root, 0, 0)
    shown = "link/" if trick == "symlinked-folder" else "evil-" if trick == "symlinked-file" else bad
    assert shown in str(info.value) and "--allow-path-prefix" in str(info.value)
    assert_refused_line(*cli(capsys, "read", str(scene.root)), shown)
    assert_refused_line(
        *cli(capsys, "changes", str(scene.root), "--starting-version", "0", "--ending-version", "0"), shown
    )
    assert seen.events() == []


@pytest.mark.parametrize("trick", TRICK_NAMES)
def test_cdc_file_path_tricks_are_refused(
    trick: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    watch: Callable[[Scene], Inotify],
) -> None:
    scene = Scene(tmp_path, CDC_TABLE)
    monkeypatch.chdir(scene.cwd)
    bad = scene.tricks(CDC_FILE)[trick]
    scene.rewrite(set_path(CDC_FILE, bad))
    seen = watch(scene)
    with pytest.raises(PathOutsideTableError):
        library_changes(scene.root, 2, 2)
    shown = "link/" if trick == "symlinked-folder" else "evil-" if trick == "symlinked-file" else bad
    assert_refused_line(
        *cli(capsys, "changes", str(scene.root), "--starting-version", "2", "--ending-version", "2"), shown
    )
    assert seen.events() == []


# --- deletion vectors ----------------------------------------------------------------------------


@pytest.mark.parametrize("trick", TRICK_NAMES)
def test_absolute_dv_path_tricks_are_refused(
    trick: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    watch: Callable[[Scene], Inotify],
) -> None:
    scene = Scene(tmp_path, DV_TABLE)
    monkeypatch.chdir(scene.cwd)
    bad = scene.tricks(DV_FILE)[trick]
    scene.rewrite(set_dv("p", bad))
    seen = watch(scene)
    with pytest.raises(PathOutsideTableError):
        library_read(scene.root, 1)
    with pytest.raises(PathOutsideTableError):
        library_changes(scene.root, 1, 1)
    shown = "link/" if trick == "symlinked-folder" else "evil-" if trick == "symlinked-file" else bad
    assert_refused_line(*cli(capsys, "read", str(scene.root), "--version", "1"), shown)
    assert_refused_line(
        *cli(capsys, "changes", str(scene.root), "--starting-version", "1", "--ending-version", "1"), shown
    )
    assert seen.events() == []


#: 'u' DVs: <prefix><z85 uuid>, read from <root>/<prefix>/deletion_vector_<uuid>.bin
U_PREFIXES = {
    "dotdot": "../outside",
    "prefix-sibling": "../tbl2",
    "deep-dotdot": "_delta_log/../../outside",
    "absolute-prefix": "{outside}",
    "symlinked-folder": "link",
}


@pytest.mark.parametrize("trick", sorted(U_PREFIXES))
def test_relative_dv_prefix_tricks_are_refused(
    trick: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    watch: Callable[[Scene], Inotify],
) -> None:
    scene = Scene(tmp_path, DV_TABLE)
    prefix = U_PREFIXES[trick].format(outside=scene.outside)
    scene.rewrite(set_dv("u", prefix + DV_ID))
    seen = watch(scene)
    with pytest.raises(PathOutsideTableError):
        library_read(scene.root, 1)
    with pytest.raises(PathOutsideTableError):
        library_changes(scene.root, 1, 1)
    assert_refused_line(*cli(capsys, "read", str(scene.root), "--version", "1"), DV_FILE)
    assert_refused_line(
        *cli(capsys, "changes", str(scene.root), "--starting-version", "1", "--ending-version", "1"), DV_FILE
    )
    assert seen.events() == []


def test_relative_dv_prefix_is_not_url_decoded(tmp_path: Path, watch: Callable[[Scene], Inotify]) -> None:
    """A 'u' prefix is a folder name: ``%2e%2e`` is a folder called so, not a way up."""
    scene = Scene(tmp_path, DV_TABLE)
    scene.rewrite(set_dv("u", "%2e%2e/outside" + DV_ID))
    seen = watch(scene)
    with pytest.raises(DeletionVectorError, match="not found") as info:
        library_read(scene.root, 1)
    assert f"{scene.root}/%2e%2e/outside/{DV_FILE}" in str(info.value)
    assert seen.events() == []


# --- allowed prefixes --------------------------------------------------------------------------------


def test_allowed_prefix_makes_an_outside_data_file_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], watch: Callable[[Scene], Inotify]
) -> None:
    """The same read succeeds with the prefix allowed, and then the outside file *is* opened: the
    watch above is able to see what the refused reads would have done."""
    reference = library_read(TABLES / DV_TABLE, None)
    scene = Scene(tmp_path, DV_TABLE)
    scene.rewrite(set_path(DATA_FILE, f"file://{scene.outside}/{DATA_FILE}"))
    seen = watch(scene)
    assert library_read(scene.root, None, (f"file://{scene.outside}",)) == reference > 0
    assert any(e.endswith(f"outside/{DATA_FILE} open") for e in seen.events())
    code, out, err = cli(capsys, "read", str(scene.root), "--allow-path-prefix", str(scene.outside))
    assert code == 0 and err == "" and len(out.splitlines()) == reference
    # the sibling is not under the allowed prefix: still refused
    scene.rewrite(set_path(f"file://{scene.outside}/{DATA_FILE}", f"{scene.sibling}/{DATA_FILE}"))
    with pytest.raises(PathOutsideTableError):
        library_read(scene.root, None, (f"file://{scene.outside}",))


def test_allowed_prefix_covers_symlink_targets_and_dvs(tmp_path: Path) -> None:
    reference = library_read(TABLES / DV_TABLE, 1)
    scene = Scene(tmp_path, DV_TABLE)
    scene.rewrite(set_dv("u", "link" + DV_ID))
    with pytest.raises(PathOutsideTableError):
        library_read(scene.root, 1)
    assert library_read(scene.root, 1, (str(scene.outside),)) == reference
    scene.rewrite(set_dv("p", f"file://{scene.outside}/{DV_FILE}"))
    assert library_read(scene.root, 1, (str(scene.outside),)) == reference


def test_change_feed_reads_an_allowed_cdc_file(tmp_path: Path) -> None:
    reference = library_changes(TABLES / CDC_TABLE, 2, 2)
    scene = Scene(tmp_path, CDC_TABLE)
    scene.rewrite(set_path(CDC_FILE, f"{scene.outside}/{CDC_FILE}"))
    with pytest.raises(PathOutsideTableError):
        library_changes(scene.root, 2, 2)
    assert library_changes(scene.root, 2, 2, (f"file://{scene.outside}/_change_data",)) == reference > 0


# --- resolve: the rules on their own ----------------------------------------------------------------


@pytest.fixture
def storage(tmp_path: Path) -> TableStorage:
    (tmp_path / "tbl").mkdir()
    return TableStorage(str(tmp_path / "tbl"))


def test_plain_and_encoded_paths_inside_the_root(storage: TableStorage, tmp_path: Path) -> None:
    root = f"{tmp_path}/tbl"
    assert storage.resolve("part-0.parquet") == f"{root}/part-0.parquet"
    assert storage.resolve("a=1/part-0.parquet") == f"{root}/a=1/part-0.parquet"
    assert storage.resolve("a=x%20y/b%3Dc.parquet") == f"{root}/a=x y/b=c.parquet"
    assert storage.resolve("a/../b.parquet") == f"{root}/b.parquet"  # stays inside: fine
    assert storage.resolve("a..b.parquet") == f"{root}/a..b.parquet"
    assert storage.resolve(f"file://{root}/x.parquet") == f"{root}/x.parquet"
    assert storage.resolve(f"file://localhost{root}/x.parquet") == f"{root}/x.parquet"
    assert storage.resolve(f"file:{root}/x%25y.parquet") == f"{root}/x%y.parquet"
    assert storage.resolve(f"{root}/x.parquet") == f"{root}/x.parquet"
    assert storage.resolve("00001.parquet", kind="sidecar") == f"{root}/_delta_log/_sidecars/00001.parquet"


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../tbl",  # the root itself is not a file in it
        "a/../../x",
        "%2e%2e/x",
        "%2E%2E%2Fx",
        "a%2F..%2F..%2Fx",
        "/etc/passwd",
        "file:///etc/passwd",
        "file://other-host/{root}/x",
        "file:relative/x",
        "s3://bucket/x",
        "s3a://bucket/x",
        "{base}/tbl2/x",
        "file://{base}/tbl2/x",
        "../tbl2/x",
    ],
)
def test_paths_leading_out_are_refused(storage: TableStorage, tmp_path: Path, path: str) -> None:
    path = path.format(root=f"{tmp_path}/tbl", base=tmp_path)
    with pytest.raises(PathOutsideTableError) as info:
        storage.resolve(path, kind="data file")
    assert info.value.exit_code == 2 and path in str(info.value)


@pytest.mark.parametrize("path", ["", "a%00b", "%ff%fe.parquet"])
def test_paths_that_are_not_paths_are_corrupt(storage: TableStorage, path: str) -> None:
    from deltamirror.core.errors import CorruptLogError

    with pytest.raises(CorruptLogError):
        storage.resolve(path)


def test_userinfo_is_not_printed(tmp_path: Path) -> None:
    storage = TableStorage(str(tmp_path))
    with pytest.raises(PathOutsideTableError) as info:
        storage.resolve("s3://AKIAKEY:hunter2secret@bucket/x.parquet")
    assert "hunter2secret" not in str(info.value) and "bucket/x.parquet" in str(info.value)


def test_object_store_paths_compare_bucket_and_components() -> None:
    storage = TableStorage("memory://bucket/tbl")
    assert storage.resolve("x.parquet") == "/bucket/tbl/x.parquet"
    assert storage.resolve("memory://bucket/tbl/a%20b.parquet") == "/bucket/tbl/a b.parquet"
    for bad in ("memory://bucket/tbl2/x", "memory://other/tbl/x", "../tbl2/x", "file:///bucket/tbl/x"):
        with pytest.raises(PathOutsideTableError):
            storage.resolve(bad)
    allowed = TableStorage("memory://bucket/tbl", allowed_path_prefixes=["memory://other/src"])
    assert allowed.resolve("memory://other/src/x.parquet") == "/other/src/x.parquet"
    with pytest.raises(PathOutsideTableError):
        allowed.resolve("memory://other/srcx/x.parquet")


def test_s3_scheme_aliases_are_one_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """delta-spark writes s3a:// where the table is opened as s3:// (an in-memory stand-in for s3fs:
    only path syntax matters here)."""
    import importlib

    from fsspec.implementations.memory import MemoryFileSystem

    class FakeS3(MemoryFileSystem):
        protocol = ("s3", "s3a")
        root_marker = ""

        @classmethod
        def _strip_protocol(cls, path: str) -> str:
            for prefix in ("s3://", "s3a://"):
                path = path.removeprefix(prefix)
            return path.rstrip("/")

    monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, "s3", FakeS3)
    storage = TableStorage("s3://bucket/tbl")
    assert storage.resolve("x.parquet") == "bucket/tbl/x.parquet"
    assert storage.resolve("s3a://bucket/tbl/x.parquet") == "bucket/tbl/x.parquet"
    assert storage.resolve("s3://bucket/tbl/a%3Db/x.parquet") == "bucket/tbl/a=b/x.parquet"
    for bad in ("s3a://other-bucket/tbl/x.parquet", "s3://bucket/tbl2/x", "gs://bucket/tbl/x", "/tbl2/x"):
        with pytest.raises(PathOutsideTableError):
            storage.resolve(bad)
    assert storage.resolve("/tbl/x.parquet") == "bucket/tbl/x.parquet"  # absolute, in the bucket
    allowed = TableStorage("s3://bucket/tbl", allowed_path_prefixes=["s3a://other-bucket/src"])
    assert allowed.resolve("s3://other-bucket/src/x.parquet") == "other-bucket/src/x.parquet"


def test_allowed_prefix_must_be_on_the_tables_storage(tmp_path: Path) -> None:
    from deltamirror.core.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="not on the table's storage"):
        TableStorage(str(tmp_path), allowed_path_prefixes=["s3://bucket/src"])


def test_allowed_prefixes_survive_pickling(tmp_path: Path) -> None:
    import pickle

    storage = TableStorage(str(tmp_path / "t"), allowed_path_prefixes=[str(tmp_path / "src")])
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.resolve(f"{tmp_path}/src/x.parquet") == f"{tmp_path}/src/x.parquet"


def test_a_log_file_behind_a_symlink_out_is_not_read(tmp_path: Path) -> None:
    """The real-path check guards every local open, the log's too."""
    scene = Scene(tmp_path, DV_TABLE)
    log = scene.root / "_delta_log"
    secret = scene.outside / "secret.json"
    secret.write_text('{"commitInfo":{}}\n')
    (log / "00000000000000000007.json").symlink_to(secret)
    storage = TableStorage(str(scene.root))
    with pytest.raises(PathOutsideTableError, match="symbolic link"):
        storage.read_bytes(storage.log_file("00000000000000000007.json"))


def test_the_command_exits_2_with_one_line_and_no_byte_of_the_file(tmp_path: Path) -> None:
    """The issue's case, as a user runs it: a 'p' DV naming /etc/passwd once printed its first byte."""
    import subprocess

    scene = Scene(tmp_path, DV_TABLE)
    scene.rewrite(set_dv("p", "file:///etc/passwd"))
    command = "import sys; from deltamirror.cli.main import main; sys.exit(main())"
    run = subprocess.run(
        [sys.executable, "-c", command, "read", str(scene.root), "--version", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "file:///etc/passwd" in run.stderr
    assert "Traceback" not in run.stderr and "format version" not in run.stderr and "root:" not in run.stderr


def test_a_read_of_many_files_is_refused_before_the_first_is_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One bad path among dozens: no row of the good files is printed first."""
    root = tmp_path / "t"
    shutil.copytree(TABLES / "gen__long-log-cdf", root)
    last = root / "_delta_log" / "00000000000000000130.json"
    lines = []
    for line in last.read_text().splitlines():
        action = json.loads(line)
        if "add" in action and action["add"]["path"].startswith("part=a/"):
            action["add"]["path"] = "..%2F..%2Fsecret.parquet"
        lines.append(json.dumps(action))
    last.write_text("\n".join(lines) + "\n")
    assert open_table(str(root)).snapshot().files.num_rows > 10
    code, out, err = cli(capsys, "read", str(root))
    assert_refused_line(code, out, err, "..%2F..%2Fsecret.parquet")
