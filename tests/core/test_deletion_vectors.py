"""Deletion vectors: Z85, the Roaring decoder, DV files, replay ids and the keep mask.

Oracles: pyroaring (an independent Roaring implementation) for bitmaps, a Z85 encoder and a
DV-file writer written here from the specs, PROTOCOL.md's own examples, Spark-written expected
snapshots and delta-rs (which applies DVs) for surviving row counts.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import urllib.parse
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltamirror.core import deletion_vectors as dvmod
from deltamirror.core.deletion_vectors import (
    decode_bitmap_array,
    dv_absolute_path,
    dv_unique_id,
    dv_unique_ids,
    keep_mask,
    read_deleted_rows,
    z85_decode,
)
from deltamirror.core.errors import DeletionVectorError
from deltamirror.core.storage import TableStorage

pyroaring = pytest.importorskip("pyroaring")

DATA = Path(__file__).resolve().parents[1] / "data"
TABLES = DATA / "tables"
MAGIC = 1681511377
# delta-spark's test suite writes DV files with this non-protocol name prefix; its logs do not
SPARK_TEST_PREFIX = "test%dv%prefix-"
SPECIAL_CHAR_PLACEHOLDER = "{{FOLDER_WITH_SPECIAL_CHAR}}"

# --- spec-side helpers (independent of the code under test) ---------------------------------------

from support.z85 import Z85_CHARS, z85_encode  # noqa: E402


def dv_bytes(rows: Any) -> bytes:
    """A DV bitmap as Delta serializes it: LE magic number + portable 64-bit Roaring (pyroaring)."""
    bitmap = rows if isinstance(rows, pyroaring.BitMap64) else pyroaring.BitMap64(rows)
    return struct.pack("<I", MAGIC) + bitmap.serialize()


def frame(bitmap: bytes) -> bytes:
    """One DV as stored in a DV file: BE size, bitmap, BE CRC-32 of the bitmap."""
    return struct.pack(">i", len(bitmap)) + bitmap + struct.pack(">I", zlib.crc32(bitmap))


def write_dv_file(path: Path, bitmaps: list[bytes], pad: int = 0) -> list[dict[str, Any]]:
    """A DV file (version byte + framed DVs, ``pad`` junk bytes before each) and its descriptors."""
    blob = bytearray(b"\x01")
    descriptors = []
    for bitmap in bitmaps:
        blob += b"\xee" * pad
        descriptors.append({"offset": len(blob), "sizeInBytes": len(bitmap)})
        blob += frame(bitmap)
    path.write_bytes(bytes(blob))
    return descriptors


def relative_id(uuid_hex: str, prefix: str = "") -> str:
    return prefix + z85_encode(bytes.fromhex(uuid_hex.replace("-", "")))


def wrap_buckets(buckets: list[tuple[int, bytes]]) -> bytes:
    """The 64-bit portable layout around already serialized 32-bit bitmaps."""
    body = struct.pack("<Q", len(buckets))
    for key, bitmap32 in buckets:
        body += struct.pack("<I", key) + bitmap32
    return struct.pack("<I", MAGIC) + body


def array_bucket(containers: list[tuple[int, list[int]]]) -> bytes:
    """A no-run-cookie 32-bit bitmap of array containers, values written exactly as given."""
    out = struct.pack("<II", 12346, len(containers))
    for key, values in containers:
        out += struct.pack("<HH", key, len(values) - 1)
    offset = len(out) + 4 * len(containers)
    for _, values in containers:
        out += struct.pack("<I", offset)
        offset += 2 * len(values)
    for _, values in containers:
        out += struct.pack(f"<{len(values)}H", *values)
    return out


def run_bucket(key: int, runs: list[tuple[int, int]], cardinality: int) -> bytes:
    """A run-cookie 32-bit bitmap with one run container of (start, length - 1) pairs."""
    out = struct.pack("<I", 12347 | (0 << 16)) + b"\x01" + struct.pack("<HH", key, cardinality - 1)
    out += struct.pack("<H", len(runs))
    for start, extra in runs:
        out += struct.pack("<HH", start, extra)
    return out


# --- Z85 --------------------------------------------------------------------------------------------


def test_z85_zeromq_spec_vector() -> None:
    assert z85_decode("HelloWorld") == bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_decode("") == b""


def z85_encode_padded(data: bytes) -> str:
    """The Rust ``z85`` crate's padded variant: a tail of n bytes is (4 - n) '#' + n + 1 digits."""
    whole = len(data) - len(data) % 4
    text = z85_encode(data[:whole])
    tail = data[whole:]
    if tail:
        value, digits = int.from_bytes(tail, "big"), []
        for _ in range(len(tail) + 1):
            value, digit = divmod(value, 85)
            digits.append(Z85_CHARS[digit])
        text += "#" * (4 - len(tail)) + "".join(reversed(digits))
    return text


@given(st.binary(max_size=64).map(lambda b: b[: len(b) - len(b) % 4]))
def test_z85_round_trips_reference_encoder(data: bytes) -> None:
    assert z85_decode(z85_encode(data)) == data


@given(st.binary(max_size=64))
def test_z85_accepts_rust_crate_padded_tail(data: bytes) -> None:
    assert z85_decode(z85_encode_padded(data)) == data


def test_z85_padded_tail_of_kernel_rs_inline_dv() -> None:
    # krs__cdf-table-with-dv v5: a 34-byte inline DV deleting row 3; "##093" is its 2-byte tail
    assert z85_decode("##093") == b"\x03\x00"


@pytest.mark.parametrize(
    "text",
    [
        "HelloWorl",  # not a multiple of 5
        "Hell~",  # '~' is base85 (RFC 1924) but not Z85
        'Hel"o',
        "Hel o",
        "Hel_o",
        "Hel|o",
        "Hellé",
        "%%%%%",  # 84 * (85**4 + ... + 1) > 2**32 - 1
        "#####",
        "####0",  # a padded tail may miss 1 to 3 bytes, not 4
        "#zzzz",  # a 3-byte tail above 2**24 - 1
        "##0~3",
        "##093HelloWorld",  # a padded tail only ends the text
    ],
)
def test_z85_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError):
        z85_decode(text)


# --- ids and paths ----------------------------------------------------------------------------------


def test_dv_unique_id_follows_protocol_derived_field() -> None:
    assert dv_unique_id("u", "ab^-aqEH.-t@S}K{vb[*k^", 4) == "uab^-aqEH.-t@S}K{vb[*k^@4"
    assert dv_unique_id("i", "wi5b=000010000siX", None) == "iwi5b=000010000siX"
    assert dv_unique_id("p", "s3://b/dv.bin", 0) == "ps3://b/dv.bin@0"


DV_STRUCT = pa.struct(
    [
        ("storageType", pa.string()),
        ("pathOrInlineDv", pa.string()),
        ("offset", pa.int32()),
        ("sizeInBytes", pa.int32()),
        ("cardinality", pa.int64()),
    ]
)

descriptor_rows = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "storageType": st.sampled_from(["u", "i", "p"]),
            "pathOrInlineDv": st.text(alphabet=Z85_CHARS + "/:é", max_size=30),
            "offset": st.one_of(st.none(), st.integers(0, 2**31 - 1)),
            "sizeInBytes": st.integers(0, 1000),
            "cardinality": st.integers(0, 1000),
        }
    ),
)


@given(st.lists(descriptor_rows, max_size=40))
def test_dv_unique_ids_matches_scalar_rule(rows: list[dict[str, Any] | None]) -> None:
    column = pa.array(rows, DV_STRUCT)
    expected = [
        None
        if r is None
        else f"{r['storageType']}{r['pathOrInlineDv']}" + ("" if r["offset"] is None else f"@{r['offset']}")
        for r in rows
    ]
    assert dv_unique_ids(column).to_pylist() == expected
    chunked = pa.chunked_array([column.slice(0, len(rows) // 2), column.slice(len(rows) // 2)], DV_STRUCT)
    assert dv_unique_ids(chunked).to_pylist() == expected


def test_dv_unique_ids_without_offset_field_and_all_null_column() -> None:
    no_offset = pa.array(
        [{"storageType": "i", "pathOrInlineDv": "abcde"}, None],
        pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string())]),
    )
    assert dv_unique_ids(no_offset).to_pylist() == ["iabcde", None]
    assert dv_unique_ids(pa.nulls(3)).to_pylist() == [None, None, None]
    wide_offset = pa.array(
        [{"storageType": "u", "pathOrInlineDv": "x", "offset": 2**40}],
        pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()), ("offset", pa.int64())]),
    )
    assert dv_unique_ids(wide_offset).to_pylist() == [f"ux@{2**40}"]
    with pytest.raises(DeletionVectorError):
        dv_unique_ids(pa.array([{"pathOrInlineDv": "x"}]))


def test_dv_unique_ids_is_vectorized_over_a_million_rows() -> None:
    n = 1_000_000
    column = pa.StructArray.from_arrays(
        [
            pa.repeat(pa.scalar("u"), n),
            pa.repeat(pa.scalar("vBn[lx{q8@P<9BNH/isA"), n),
            pa.array(range(n), pa.int32()),
        ],
        names=["storageType", "pathOrInlineDv", "offset"],
    )
    ids = dv_unique_ids(column)
    assert (
        len(ids) == n
        and ids[0].as_py() == "uvBn[lx{q8@P<9BNH/isA@0"
        and ids[n - 1].as_py().endswith("@999999")
    )


def test_relative_path_protocol_example(tmp_path: Path) -> None:
    # PROTOCOL.md "JSON Example 1": prefix 'ab', uuid d2c639aa-8816-431a-aaf6-d3fe2512ff61
    storage = TableStorage(str(tmp_path))
    assert dv_absolute_path(storage, "u", "ab^-aqEH.-t@S}K{vb[*k^") == (
        f"{tmp_path}/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    no_prefix = relative_id("0229ec3d-5100-44e1-8e53-702d448da8da")
    assert dv_absolute_path(storage, "u", no_prefix) == (
        f"{tmp_path}/deletion_vector_0229ec3d-5100-44e1-8e53-702d448da8da.bin"
    )


def test_absolute_path_is_decoded_uri(tmp_path: Path) -> None:
    storage = TableStorage(str(tmp_path))
    uri = "file:" + urllib.parse.quote(f"{tmp_path}/folder&with%special char/x%dv.bin")
    assert dv_absolute_path(storage, "p", uri) == f"{tmp_path}/folder&with%special char/x%dv.bin"


@pytest.mark.parametrize(
    ("storage_type", "value", "needle"),
    [
        ("u", "tooShort", "shorter"),
        ("u", "ab~~~~~~~~~~~~~~~~~~~~", "UUID"),
        ("i", "abcde", "inline"),
        ("x", "abc", "storageType"),
    ],
)
def test_dv_absolute_path_errors(tmp_path: Path, storage_type: str, value: str, needle: str) -> None:
    with pytest.raises(DeletionVectorError, match=needle):
        dv_absolute_path(TableStorage(str(tmp_path)), storage_type, value)


# --- the Roaring decoder against pyroaring ----------------------------------------------------------


@st.composite
def row_sets(draw: st.DrawFn) -> tuple[list[int], bool]:
    """Row indexes exercising every container kind, several 16-bit keys and several 32-bit buckets."""
    bucket_keys = draw(
        st.lists(
            st.one_of(st.sampled_from([0, 1, 2**31 - 1]), st.integers(0, 2**31 - 1)),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    rows: set[int] = set()
    for bucket in bucket_keys:
        for key in draw(st.lists(st.integers(0, 65535), min_size=1, max_size=5, unique=True)):
            base = bucket << 32 | key << 16
            kind = draw(st.sampled_from(["array", "bitmap", "few_runs", "many_runs", "full", "edges"]))
            rng = random.Random(draw(st.integers(0, 2**32)))
            if kind == "array":
                lows: Any = draw(st.lists(st.integers(0, 65535), min_size=1, max_size=300))
            elif kind == "bitmap":
                lows = rng.sample(range(65536), draw(st.integers(4097, 40000)))
            elif kind == "few_runs":
                lows = []
                for _ in range(draw(st.integers(1, 16))):
                    start = rng.randrange(65536)
                    lows.extend(range(start, min(start + rng.randrange(1, 5000), 65536)))
            elif kind == "many_runs":
                lows, start = [], rng.randrange(50)
                for _ in range(draw(st.integers(17, 800))):
                    length = rng.randrange(1, 40)
                    lows.extend(range(start, min(start + length, 65536)))
                    start += length + rng.randrange(1, 40)
                    if start >= 65536:
                        break
            elif kind == "full":
                lows = range(65536)
            else:
                lows = [0, 65535]
            rows.update(base | low for low in lows)
    return sorted(rows), draw(st.booleans())


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(row_sets())
def test_decoder_matches_pyroaring(case: tuple[list[int], bool]) -> None:
    rows, optimize = case
    bitmap = pyroaring.BitMap64(rows)
    if optimize:
        bitmap.run_optimize()
    decoded = decode_bitmap_array(dv_bytes(bitmap))
    assert decoded.type == pa.uint64()
    assert decoded.to_pylist() == rows


def test_decoder_covers_both_cookies_and_offset_headers() -> None:
    # pyroaring's 32-bit BitMap: without run_optimize -> cookie 12346; with -> 12347, whose
    # offset header is present only from 4 containers on
    cases = [
        (list(range(0, 200_000, 7)), False, 12346),
        (list(range(10, 30_000)), True, 12347),  # 1 run container, no offsets
        ([*range(0, 70_000, 3), *range(100_000, 400_000)], True, 12347),  # >= 4 containers, offsets
        ([*range(100), *(k * 65536 + 7 for k in (1, 2))], True, 12347),  # 3 containers: no offsets
        ([*range(100), *(k * 65536 + 7 for k in (1, 2, 3))], True, 12347),  # exactly 4: offsets
    ]
    for values, optimize, cookie in cases:
        bitmap32 = pyroaring.BitMap(values)
        if optimize:
            bitmap32.run_optimize()
        serialized = bitmap32.serialize()
        assert struct.unpack_from("<I", serialized)[0] & 0xFFFF == cookie
        expected = sorted({(5 << 32) | v for v in values} | set(values))
        decoded = decode_bitmap_array(wrap_buckets([(0, serialized), (5, serialized)]))
        assert decoded.to_pylist() == expected


def test_decoder_empty_and_top_values() -> None:
    assert decode_bitmap_array(dv_bytes([])).to_pylist() == []
    top = [(2**31 - 1) << 32 | 0xFFFFFFFF, 0]
    assert decode_bitmap_array(dv_bytes(top)).to_pylist() == sorted(top)


@pytest.mark.parametrize("n_runs", [3, 200])  # the per-run path and the kernel path
def test_run_containers_few_and_many_runs(n_runs: int) -> None:
    rows = [k * 300 + i for k in range(n_runs) for i in range(k % 7 + 1)]
    bitmap = pyroaring.BitMap64(rows)
    bitmap.run_optimize()
    assert decode_bitmap_array(dv_bytes(bitmap)).to_pylist() == rows


def test_protocol_inline_example_uses_unsupported_native_layout() -> None:
    # PROTOCOL.md "JSON Example 3" is the native layout (magic 1681511376, big-endian framing)
    data = z85_decode("wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L")
    with pytest.raises(DeletionVectorError, match="native"):
        decode_bitmap_array(data)


MALFORMED = {
    "wrong magic": struct.pack("<I", MAGIC + 2) + bytes(8),
    "trailing bytes": dv_bytes([1, 2, 3]) + b"\x00",
    "bucket key with top bit": wrap_buckets([(2**31, array_bucket([(0, [1])]))]),
    "buckets not ascending": wrap_buckets([(3, array_bucket([(0, [1])])), (2, array_bucket([(0, [1])]))]),
    "containers not ascending": wrap_buckets([(0, array_bucket([(5, [1]), (4, [1])]))]),
    "array not sorted": wrap_buckets([(0, array_bucket([(0, [5, 3])]))]),
    "array duplicate": wrap_buckets([(0, array_bucket([(0, [5, 5])]))]),
    "unknown cookie": wrap_buckets([(0, struct.pack("<II", 999, 0))]),
    "too many buckets": struct.pack("<IQ", MAGIC, 2**40),
    "run past container": wrap_buckets([(0, run_bucket(0, [(65530, 10)], 11))]),
    "few runs overlap": wrap_buckets([(0, run_bucket(0, [(10, 5), (12, 5)], 12))]),
    "many runs overlap": wrap_buckets([(0, run_bucket(0, [(i * 3, 4) for i in range(20)], 100))]),
    "run count differs": wrap_buckets([(0, run_bucket(0, [(10, 5)], 7))]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_decoder_rejects_malformed(name: str) -> None:
    with pytest.raises(DeletionVectorError, match="malformed"):
        decode_bitmap_array(MALFORMED[name])


def test_every_truncation_is_a_deletion_vector_error() -> None:
    bitmap = pyroaring.BitMap64(
        [1, 5, 70_000, *range(200_000, 200_100), 2**33 + 9, *range(2**34, 2**34 + 5000)]
    )
    bitmap.run_optimize()
    data = dv_bytes(bitmap)
    for cut in range(len(data)):
        with pytest.raises(DeletionVectorError):
            decode_bitmap_array(data[:cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_garbage_never_escapes_as_another_exception(body: bytes) -> None:
    try:
        rows = decode_bitmap_array(struct.pack("<IQ", MAGIC, 1) + body)
    except DeletionVectorError:
        return
    values = rows.to_pylist()
    assert values == sorted(set(values))


# --- DV files ---------------------------------------------------------------------------------------


@pytest.fixture
def dv_table(tmp_path: Path) -> tuple[TableStorage, Path, list[dict[str, Any]], list[list[int]]]:
    """A table root holding one DV file with three DVs, the last beyond the version-check window."""
    uuid_hex = "0229ec3d-5100-44e1-8e53-702d448da8da"
    (tmp_path / "pp").mkdir()
    path = tmp_path / "pp" / f"deletion_vector_{uuid_hex}.bin"
    row_sets_ = [[0, 9], list(range(3, 70_000, 2)), [2**32 + 1]]
    placed = write_dv_file(path, [dv_bytes(r) for r in row_sets_], pad=3000)
    descriptors = [
        {"storageType": "u", "pathOrInlineDv": relative_id(uuid_hex, "pp"), "cardinality": len(r), **p}
        for r, p in zip(row_sets_, placed, strict=True)
    ]
    assert descriptors[-1]["offset"] > 4096
    return TableStorage(str(tmp_path)), path, descriptors, row_sets_


def test_reads_each_dv_of_a_file(dv_table: Any) -> None:
    storage, _, descriptors, row_sets_ = dv_table
    for descriptor, rows in zip(descriptors, row_sets_, strict=True):
        assert read_deleted_rows(storage, descriptor).to_pylist() == rows


def test_absolute_path_descriptor(dv_table: Any) -> None:
    storage, path, descriptors, row_sets_ = dv_table
    descriptor = {
        **descriptors[0],
        "storageType": "p",
        "pathOrInlineDv": "file:" + urllib.parse.quote(str(path)),
    }
    assert read_deleted_rows(storage, descriptor).to_pylist() == row_sets_[0]


def test_inline_descriptor() -> None:
    rows = [3, 4, 7, 11, 18, 29, 2**32 + 1]
    bitmap = dv_bytes(rows)
    descriptor = {"storageType": "i", "sizeInBytes": len(bitmap), "cardinality": 7}
    storage = TableStorage("/nonexistent")
    # Delta's Base85Codec pads with zero bytes; the Rust z85 crate writes a '#'-padded tail
    for text in (z85_encode(bitmap + b"\x00" * (-len(bitmap) % 4)), z85_encode_padded(bitmap)):
        assert read_deleted_rows(storage, {**descriptor, "pathOrInlineDv": text}).to_pylist() == rows


def _corrupt(path: Path, at: int, value: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[at] = value
    path.write_bytes(bytes(blob))


def _expect_error(storage: TableStorage, descriptor: dict[str, Any], needle: str, file: str) -> None:
    with pytest.raises(DeletionVectorError, match=needle) as info:
        read_deleted_rows(storage, descriptor, data_file="part-0.parquet")
    assert file in str(info.value) and "part-0.parquet" in str(info.value)


def test_checksum_mismatch_names_file(dv_table: Any) -> None:
    storage, path, descriptors, _ = dv_table
    d = descriptors[0]
    _corrupt(path, d["offset"] + 4 + d["sizeInBytes"] + 3, 0x5A)  # last checksum byte
    _expect_error(storage, d, "checksum", str(path))
    _corrupt(path, descriptors[1]["offset"] + 20, 0xFF)  # a bitmap byte
    _expect_error(storage, descriptors[1], "checksum", str(path))


def test_wrong_magic_with_valid_checksum_names_file(tmp_path: Path) -> None:
    uuid_hex = "179561f5-946c-40d8-b088-0d890e8c854c"
    bad = struct.pack("<I", 1234) + dv_bytes([1, 2])[4:]
    path = tmp_path / f"deletion_vector_{uuid_hex}.bin"
    (placed,) = write_dv_file(path, [bad])
    descriptor = {"storageType": "u", "pathOrInlineDv": relative_id(uuid_hex), "cardinality": 2, **placed}
    _expect_error(TableStorage(str(tmp_path)), descriptor, "magic", str(path))


def test_missing_file_names_file(dv_table: Any) -> None:
    storage, path, descriptors, _ = dv_table
    path.unlink()
    _expect_error(storage, descriptors[0], "not found", str(path))


def test_descriptor_mismatches(dv_table: Any) -> None:
    storage, path, descriptors, _ = dv_table
    d = descriptors[0]
    _expect_error(storage, {**d, "cardinality": 3}, "cardinality", str(path))
    _expect_error(storage, {**d, "sizeInBytes": d["sizeInBytes"] + 1}, "size", str(path))
    _expect_error(storage, {**d, "maxRowIndex": 8}, "maxRowIndex", str(path))
    assert read_deleted_rows(storage, {**d, "maxRowIndex": 9}).to_pylist() == [0, 9]
    _expect_error(storage, {**d, "offset": 10**6}, "too short", str(path))
    _expect_error(storage, {**d, "cardinality": None}, "cardinality", str(path))
    _corrupt(path, 0, 2)
    _expect_error(storage, d, "version", str(path))


def test_inline_errors() -> None:
    storage = TableStorage("/nonexistent")
    good = dv_bytes([1])
    text = z85_encode_padded(good)
    _expect_error(
        storage,
        {"storageType": "i", "pathOrInlineDv": text[:-1], "sizeInBytes": len(good), "cardinality": 1},
        "Z85",
        "inline",
    )
    _expect_error(
        storage,
        {"storageType": "i", "pathOrInlineDv": text, "sizeInBytes": len(good) + 8, "cardinality": 1},
        "sizeInBytes",
        "inline",
    )
    _expect_error(
        storage,
        {"storageType": "q", "pathOrInlineDv": text, "sizeInBytes": len(good), "cardinality": 1},
        "storageType",
        "q",
    )


# --- real tables ------------------------------------------------------------------------------------


def file_actions(root: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    for commit in sorted((root / "_delta_log").glob("*.json")):
        version = int(commit.name.split(".")[0])
        for line in commit.read_text().splitlines():
            if line.strip():
                action = json.loads(line)
                for kind in ("add", "remove"):
                    if kind in action:
                        yield version, kind, action[kind]


def live_adds(root: Path) -> list[dict[str, Any]]:
    """Replay of JSON commits keyed by (path, DV unique id), as PROTOCOL.md's reconciliation says."""
    live: dict[tuple[str, str | None], dict[str, Any]] = {}
    for _, kind, action in file_actions(root):
        dv = action.get("deletionVector")
        key = (
            action["path"],
            None if dv is None else dv_unique_id(dv["storageType"], dv["pathOrInlineDv"], dv.get("offset")),
        )
        if kind == "add":
            live[key] = action
        else:
            live.pop(key, None)
    return list(live.values())


def prepared_table(name: str, tmp_path: Path) -> Path:
    """The table itself, or for delta-spark test tables a copy made readable by the protocol.

    Those were written with Spark's test-only DV name prefix and a path placeholder that Spark's
    tests substitute; the copy renames the files and fills the placeholder, as those tests do.
    """
    source = TABLES / name
    if not name.startswith("spark__"):
        return source
    root = tmp_path / name
    shutil.copytree(source, root)
    for commit in (root / "_delta_log").glob("*.json"):
        text = commit.read_text()
        if SPECIAL_CHAR_PLACEHOLDER in text:
            commit.write_text(
                text.replace(
                    SPECIAL_CHAR_PLACEHOLDER, urllib.parse.quote(str(root / "folder&with%special char"))
                )
            )
    for dv_file in list(root.glob(f"{SPARK_TEST_PREFIX}deletion_vector_*.bin")):
        dv_file.rename(root / dv_file.name[len(SPARK_TEST_PREFIX) :])
    return root


def pyroaring_rows(storage: TableStorage, dv: dict[str, Any]) -> list[int]:
    """Oracle: the DV's rows as pyroaring reads the same bytes (framing parsed here)."""
    if dv["storageType"] == "i":
        raw = z85_decode(dv["pathOrInlineDv"])[: dv["sizeInBytes"]]
    else:
        blob = Path(dv_absolute_path(storage, dv["storageType"], dv["pathOrInlineDv"])).read_bytes()
        start = (dv.get("offset") or 0) + 4
        raw = blob[start : start + dv["sizeInBytes"]]
    assert struct.unpack_from("<I", raw)[0] == MAGIC
    return list(pyroaring.BitMap64.deserialize(raw[4:]))


DV_TABLES = [
    "krs__table-with-dv-small",
    "kj__basic-dv-no-checkpoint",
    "kj__basic-dv-with-checkpoint",
    "krs__with-short-dv",
    "krs__cdf-table-with-dv",
    "golden__log-replay-dv-key-cases",
    "golden__dv-partitioned-with-checkpoint",
    "golden__dv-with-columnmapping",
    "drs__table_with_deletion_logs",
    "spark__table-with-dv-small",
    "spark__table-with-dv-large",
    "spark__partitioned-table-with-dv-large",
    "spark__table-with-dv-special-char",
]


@pytest.mark.parametrize("name", DV_TABLES)
def test_every_dv_of_real_tables(name: str, tmp_path: Path) -> None:
    root = prepared_table(name, tmp_path)
    storage = TableStorage(str(root))
    seen = 0
    for _, kind, action in file_actions(root):
        dv = action.get("deletionVector")
        if dv is None:
            continue
        rows = read_deleted_rows(storage, dv, data_file=action["path"])
        assert len(rows) == dv["cardinality"] > 0
        assert rows.to_pylist() == pyroaring_rows(storage, dv)
        if kind == "add":
            assert rows[-1].as_py() < json.loads(action["stats"])["numRecords"]
        seen += 1
    assert seen > 0


def surviving(root: Path) -> list[tuple[dict[str, Any], pa.Table]]:
    storage = TableStorage(str(root))
    out = []
    for add in live_adds(root):
        data_file = root / urllib.parse.unquote(add["path"])  # relative, URL-encoded (PROTOCOL.md)
        data = pq.read_table(data_file)
        if add.get("deletionVector"):
            deleted = read_deleted_rows(storage, add["deletionVector"], data_file=add["path"])
            data = data.filter(keep_mask(deleted, data.num_rows))
            assert data.num_rows == pq.ParquetFile(data_file).metadata.num_rows - len(deleted)
        out.append((add, data))
    return out


def expected_snapshot(name: str) -> pa.Table:
    return pq.read_table(sorted((DATA / "expected" / "golden_snapshot" / name).glob("*.parquet")))


def test_surviving_rows_match_spark_snapshot_log_replay_dv_key_cases() -> None:
    rows = sorted(
        v
        for _, t in surviving(TABLES / "golden__log-replay-dv-key-cases")
        for v in t.column("id").to_pylist()
    )
    assert rows == sorted(expected_snapshot("log-replay-dv-key-cases").column("id").to_pylist())


def test_surviving_rows_match_spark_snapshot_dv_partitioned() -> None:
    rows = sorted(
        (int(add["partitionValues"]["part"]), r["col1"], r["col2"])
        for add, t in surviving(TABLES / "golden__dv-partitioned-with-checkpoint")
        for r in t.select(["col1", "col2"]).to_pylist()
    )
    expected = expected_snapshot("dv-partitioned-with-checkpoint")
    assert rows == sorted((r["part"], r["col1"], r["col2"]) for r in expected.to_pylist())


@pytest.mark.parametrize(
    "name",
    [
        "krs__table-with-dv-small",
        "kj__basic-dv-no-checkpoint",
        "kj__basic-dv-with-checkpoint",
        "krs__with-short-dv",
    ],
)
def test_surviving_row_count_matches_delta_rs(name: str) -> None:
    deltalake = pytest.importorskip("deltalake")
    result = (
        deltalake.QueryBuilder()
        .register("t", deltalake.DeltaTable(str(TABLES / name)))
        .execute("select count(*) as n from t")
    )
    expected = pa.table(result.read_all()).column("n")[0].as_py()
    assert sum(t.num_rows for _, t in surviving(TABLES / name)) == expected


# --- keep mask --------------------------------------------------------------------------------------


@settings(deadline=None)  # a loaded CI machine is not a failure
@given(
    st.integers(0, 3000).flatmap(
        lambda n: st.tuples(st.just(n), st.sets(st.integers(0, max(n - 1, 0)), max_size=n))
    )
)
def test_keep_mask_matches_set_membership(case: tuple[int, set[int]]) -> None:
    num_rows, deleted_set = case
    deleted = pa.array(sorted(deleted_set), pa.uint64())
    expected = [i not in deleted_set for i in range(num_rows)]
    assert keep_mask(deleted, num_rows).to_pylist() == expected
    assert dvmod._keep_mask_by_lookup(deleted.cast(pa.int64()), num_rows).to_pylist() == expected


def test_keep_mask_rejects_rows_past_the_file() -> None:
    with pytest.raises(DeletionVectorError, match="part-7") as info:
        keep_mask(pa.array([2, 10], pa.uint64()), 10, data_file="part-7")
    assert "10 rows" in str(info.value)
    assert keep_mask(pa.array([], pa.uint64()), 0).to_pylist() == []
    assert keep_mask(pa.array([0, 9], pa.uint64()), 10).true_count == 8


# --- sizes from the log, and files that are not DVs ---------------------------------------------------


def _peak_bytes(fn: Any) -> tuple[Any, int]:
    import tracemalloc

    tracemalloc.start()
    try:
        try:
            result: Any = fn()
        except DeletionVectorError as exc:
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("sizeInBytes", 10**12, "out of range"),
        ("sizeInBytes", 2**31 - 1, "larger than any"),
        ("sizeInBytes", -1, "out of range"),
        ("offset", 10**12, "out of range"),
        ("sizeInBytes", "36", "non-integer"),
        ("sizeInBytes", float("inf"), "non-integer"),
    ],
)
def test_sizes_from_the_log_are_checked_before_reading(
    dv_table: Any, field: str, value: Any, needle: str
) -> None:
    storage, path, descriptors, _ = dv_table
    error, peak = _peak_bytes(lambda: read_deleted_rows(storage, {**descriptors[0], field: value}))
    assert isinstance(error, DeletionVectorError) and needle in str(error) and str(path) in str(error)
    assert peak < 1 << 20


def test_a_size_beyond_the_file_allocates_no_more_than_the_file(dv_table: Any) -> None:
    storage, path, descriptors, _ = dv_table
    size = 2**29  # under the sanity limit, far beyond the file
    error, peak = _peak_bytes(lambda: read_deleted_rows(storage, {**descriptors[0], "sizeInBytes": size}))
    assert isinstance(error, DeletionVectorError) and "too short" in str(error)
    assert peak < 4 * path.stat().st_size + (1 << 20)


def test_cardinality_beyond_the_data_file_is_refused_before_reading(dv_table: Any) -> None:
    storage, path, descriptors, _ = dv_table
    path.unlink()  # nothing can be read: the refusal must come first
    with pytest.raises(DeletionVectorError, match="more than the data file's 1 rows"):
        read_deleted_rows(storage, descriptors[0], num_rows=1)


def test_few_bytes_claiming_billions_of_rows_are_refused_before_expanding(tmp_path: Path) -> None:
    """20,000 full run containers: 380 KB of DV, 1.3 billion rows (10 GB of row indexes)."""
    bitmap = wrap_buckets([(k, run_bucket(0, [(0, 65535)], 65536)) for k in range(20_000)])
    uuid_hex = "0229ec3d-5100-44e1-8e53-702d448da8da"
    (placed,) = write_dv_file(tmp_path / f"deletion_vector_{uuid_hex}.bin", [bitmap])
    descriptor = {"storageType": "u", "pathOrInlineDv": relative_id(uuid_hex), "cardinality": 3, **placed}
    error, peak = _peak_bytes(lambda: read_deleted_rows(TableStorage(str(tmp_path)), descriptor))
    assert isinstance(error, DeletionVectorError) and "cardinality" in str(error)
    assert peak < 64 << 20


# the bytes of a file that is not a DV, each a value the old messages would have printed
NOT_A_DV = bytes([0xC7, 0x00, 0x00, 0x00, 0x2A, 0x13, 0x37, 0xBE, 0xEF]) + b"SECRET-CONTENT" * 8


def _assert_no_content(message: str, folder: Path) -> None:
    assert "\n" not in message and "SECRET" not in message
    rest = message.replace(str(folder), "").lower()  # a tmp folder's name may hold any digits
    for leaked in ("199", "0xc7", "0x2a", "beef", "1337"):
        assert leaked not in rest, message


@pytest.mark.parametrize("offset", [None, 1, 5000])
def test_a_file_that_is_not_a_dv_is_refused_without_echoing_it(tmp_path: Path, offset: int | None) -> None:
    (tmp_path / "notes.txt").write_bytes(NOT_A_DV * 100)
    descriptor = {"storageType": "p", "pathOrInlineDv": f"file://{tmp_path}/notes.txt", "sizeInBytes": 40}
    descriptor |= {"cardinality": 1, "offset": offset}
    with pytest.raises(DeletionVectorError) as info:
        read_deleted_rows(TableStorage(str(tmp_path)), descriptor)
    _assert_no_content(str(info.value), tmp_path)


def test_checksum_and_magic_errors_echo_no_bytes(dv_table: Any, tmp_path: Path) -> None:
    storage, path, descriptors, _ = dv_table
    d = descriptors[0]
    _corrupt(path, d["offset"] + 4 + d["sizeInBytes"], 0xC7)  # first checksum byte
    with pytest.raises(DeletionVectorError, match="checksum") as info:
        read_deleted_rows(storage, d)
    assert "stored" not in str(info.value) and "computed" not in str(info.value)
    uuid_hex = "179561f5-946c-40d8-b088-0d890e8c854c"
    bad = struct.pack("<I", 0xC7C7C7C7) + dv_bytes([1, 2])[4:]
    (placed,) = write_dv_file(tmp_path / "pp" / f"deletion_vector_{uuid_hex}.bin", [bad])
    descriptor = {
        "storageType": "u",
        "pathOrInlineDv": relative_id(uuid_hex, "pp"),
        "cardinality": 2,
        **placed,
    }
    with pytest.raises(DeletionVectorError, match="magic") as info:
        read_deleted_rows(storage, descriptor)
    assert str(0xC7C7C7C7) not in str(info.value)


@pytest.mark.parametrize("text", ["abc", "~~~~~", "abcd\u00e9", "#####", "\n\n\n\n\n"])
def test_bad_inline_z85_is_one_line(text: str) -> None:
    descriptor = {"storageType": "i", "pathOrInlineDv": text, "sizeInBytes": 4, "cardinality": 1}
    with pytest.raises(DeletionVectorError, match="Z85") as info:
        read_deleted_rows(TableStorage("/nonexistent"), descriptor)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("descriptor", [None, [], "u", 7])
def test_a_descriptor_that_is_not_an_object_is_an_error(descriptor: Any) -> None:
    with pytest.raises(DeletionVectorError, match="not an object"):
        read_deleted_rows(TableStorage("/nonexistent"), descriptor)
