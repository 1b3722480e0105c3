"""Pairing a version's update images by key in bounded memory: a grace hash join spilled to Arrow IPC.

A change data file may hold every post-image of a version before its pre-images, so an image can
wait for its partner across the whole version. Instead of holding the images, the first read of a
keyed version hands each update image (its row position in the version, the 64-bit hash and payload
of its key, pre or post, its JSON text) to :class:`UpdatePairs`, which keeps them in memory while
they fit a quarter of the memory budget and otherwise routes them by hash into buckets on disk
(Arrow IPC streams in a private temporary directory). Each bucket is then paired on its own (one
that is still too large is split again by further bits of the hash) into a list of pair entries
sorted by row position; the second read takes, for each batch, the entries of its row range from
every bucket at once (a merge by position).

The outcome does not depend on the number of buckets or the budget: a key is paired exactly when
its hash is seen once as a pre-image and once as a post-image in the whole version and both images
have the same key, and the ``"u"`` event goes out at the later image's row position. The records
of a version are therefore the same on every read, which is what lets a restart skip the records
its committed progress counts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pyarrow as pa

from deltamirror.core.compute import pc

#: the default memory budget of one version's pairing (``row_changes.pairing_memory_mb``)
DEFAULT_PAIRING_MEMORY_BYTES = 256 * 1024 * 1024
#: bucket count bounds (a power of two; further bits split a bucket that is still too large)
MAX_BUCKETS = 256
_SPLIT_BITS = 3
#: a bucket this small is never split (a tiny budget must not make thousands of files)
MIN_BUCKET_BYTES = 64 * 1024
#: temporary directory name prefix (a killed process leaves one behind; nothing reads it again)
SPILL_PREFIX = "deltamirror-pairing-"


def image_schemas(image_type: pa.DataType = pa.large_string()) -> tuple[pa.Schema, pa.Schema]:
    """The schemas of the images pairing holds and of its pair entries, for images of ``image_type``
    (``large_string``: JSON text; ``large_binary``: a binary format's, e.g. Avro)."""
    images = pa.schema(
        [
            ("pos", pa.int64()),
            ("h", pa.uint64()),
            ("pre", pa.bool_()),
            ("key", pa.large_binary()),
            ("image", image_type),
        ]
    )
    #: a pair entry: at the later image's position the ``"u"`` (key, before, after); at the earlier
    #: image's position nothing (key null)
    pairs = pa.schema(
        [
            ("pos", pa.int64()),
            ("key", pa.large_binary()),
            ("before", image_type),
            ("after", image_type),
        ]
    )
    return images, pairs


#: the schemas of JSON images (the JSON formats')
IMAGE_SCHEMA, PAIR_SCHEMA = image_schemas()
_END = 2**62


class UpdatePairs:
    """The pairs of one version's update images; add every image (:meth:`add`), :meth:`finish`, then
    :meth:`take` each row range in order. Always :meth:`close` (it removes the spill files)."""

    def __init__(
        self,
        memory_bytes: int = DEFAULT_PAIRING_MEMORY_BYTES,
        *,
        expected_bytes: int | None = None,
        spill_dir: str | None = None,
        image_type: pa.DataType = pa.large_string(),
    ) -> None:
        self.image_schema, self.pair_schema = (
            (IMAGE_SCHEMA, PAIR_SCHEMA) if image_type == pa.large_string() else image_schemas(image_type)
        )
        self.memory_bytes = max(1, memory_bytes)
        #: bytes a bucket may hold to be paired at once (pairing holds about three times as much)
        self.bucket_bytes = max(MIN_BUCKET_BYTES, self.memory_bytes // 8)
        self.expected_bytes = expected_bytes
        self.spill_dir = spill_dir
        self.directory: str | None = None
        #: buckets made (files), for the record; 0 when everything was paired in memory
        self.buckets = 0
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self._bucket_bits = 0
        self._writers: list[_BucketFile] = []
        self._sources: list[_SortedSource] = []
        self._files = 0

    # --- the first read -----------------------------------------------------------------------

    def add(self, images: pa.RecordBatch) -> None:
        """Update images with :attr:`image_schema`'s columns."""
        if not images.num_rows:
            return
        if self._writers:
            self._route(images)
            return
        self._held.append(images)
        self._held_bytes += images.nbytes
        if self._held_bytes > self.bucket_bytes:
            self._start_spilling()

    def _start_spilling(self) -> None:
        expected = max(self.expected_bytes or 0, 4 * self._held_bytes)
        buckets = 2
        while buckets < MAX_BUCKETS and buckets * self.bucket_bytes < expected:
            buckets *= 2
        self._bucket_bits = buckets.bit_length() - 1
        self.directory = tempfile.mkdtemp(prefix=SPILL_PREFIX, dir=self.spill_dir)
        flush = max(1 << 20, self.bucket_bytes // (4 * buckets))
        self._writers = [_BucketFile(self._new_path(), flush, self.image_schema) for _ in range(buckets)]
        self.buckets = buckets
        held, self._held, self._held_bytes = self._held, [], 0
        for batch in held:
            self._route(batch)

    def _new_path(self) -> str:
        assert self.directory is not None
        self._files += 1
        return os.path.join(self.directory, f"{self._files}.arrow")

    def _route(self, images: pa.RecordBatch) -> None:
        for bucket, part in _split(images, 0, self._bucket_bits):
            self._writers[bucket].add(part)

    def finish(self) -> None:
        """Pair every bucket: the pair entries are ready to :meth:`take`."""
        if not self._writers:
            pairs = _pair(pa.Table.from_batches(self._held, self.image_schema), self.pair_schema)
            self._held, self._held_bytes = [], 0
            self._sources.append(_SortedSource(iter(pairs.to_batches())))
            return
        writers, self._writers = self._writers, []
        files = [(w.close(), self._bucket_bits) for w in writers]
        while files:
            path, shift = files.pop(0)
            if os.path.getsize(path) > self.bucket_bytes and shift + _SPLIT_BITS <= 64:
                files.extend(self._split_file(path, shift))  # a bucket still too large: split it again
                continue
            with pa.memory_map(path) as source:
                table = pa.ipc.open_stream(source).read_all()
            pairs = _pair(table, self.pair_schema)
            del table
            os.remove(path)
            if pairs.num_rows:
                self._sources.append(self._spilled(pairs))
            del pairs  # not alive while the next bucket is paired

    def _split_file(self, path: str, shift: int) -> list[tuple[str, int]]:
        flush = max(1 << 20, self.bucket_bytes // (4 << _SPLIT_BITS))
        parts = [_BucketFile(self._new_path(), flush, self.image_schema) for _ in range(1 << _SPLIT_BITS)]
        self.buckets += len(parts) - 1
        with pa.memory_map(path) as source:
            for batch in pa.ipc.open_stream(source):
                for bucket, part in _split(batch, shift, _SPLIT_BITS):
                    parts[bucket].add(part)
        os.remove(path)
        split = [(p.close(), shift + _SPLIT_BITS) for p in parts if p.rows]
        if len(split) == 1:  # every image in one part: one key's images (a key updated many times)
            return [(split[0][0], 64)]
        for p in parts:
            if not p.rows:
                os.remove(p.path)
        return split

    def _spilled(self, pairs: pa.Table) -> _SortedSource:
        """``pairs`` written out in chunks small enough that one chunk of every bucket (read at once
        by :meth:`take`) holds half a bucket's bytes at most."""
        path = self._new_path()
        per_row = max(1, pairs.nbytes // max(1, pairs.num_rows))
        rows = max(64, self.bucket_bytes // (2 * max(1, self.buckets) * per_row))
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, self.pair_schema) as writer:
            writer.write_table(pairs, max_chunksize=rows)
        return _SortedSource(_read_stream(path))

    # --- the second read ----------------------------------------------------------------------

    def take(self, start: int, end: int) -> pa.Table:
        """The pair entries of rows ``start`` to ``end`` (excluded), by position; none may lie before."""
        parts = [batch for source in self._sources for batch in source.take_until(end)]
        if not parts:
            return self.pair_schema.empty_table()
        table = pa.Table.from_batches(parts, self.pair_schema)
        if pc.min(table.column("pos")).as_py() < start:
            raise ValueError(f"pair entries before row {start} were not taken")
        return table.sort_by("pos") if len(parts) > 1 else table

    def left_over(self) -> int:
        """Pair entries at positions no read reached (the version's rows changed between the reads)."""
        return int(self.take(0, _END).num_rows)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()
        self._writers = []
        self._held = []
        for source in self._sources:
            source.close()
        self._sources = []
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> UpdatePairs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _BucketFile:
    """One bucket on disk: images gathered up to ``flush`` bytes, then appended as one batch."""

    def __init__(self, path: str, flush: int, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.flush = flush
        self._sink = pa.OSFile(path, "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)
        self._pending: list[pa.RecordBatch] = []
        self._bytes = 0
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        self._pending.append(batch)
        self._bytes += batch.nbytes
        if self._bytes >= self.flush:
            self._write()

    def _write(self) -> None:
        if self._pending:
            self._writer.write_table(pa.Table.from_batches(self._pending, self.schema))
        self._pending, self._bytes = [], 0

    def close(self) -> str:
        if not self._sink.closed:
            try:
                self._write()
                self._writer.close()
            finally:
                self._sink.close()
        return self.path


class _SortedSource:
    """Pair entries sorted by position, handed out range by range."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._current: pa.RecordBatch | None = None
        self._offset = 0

    def take_until(self, end: int) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        while True:
            current = self._current
            if current is None or self._offset >= current.num_rows:
                current = self._current = next(self._batches, None)
                self._offset = 0
                if current is None:
                    return out
            below = pc.sum(pc.less(current.column("pos"), end)).as_py() or 0  # sorted: a prefix
            if below > self._offset:
                out.append(current.slice(self._offset, below - self._offset))
                self._offset = below
            if self._offset < current.num_rows:
                return out

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
        self._current = None


def _read_stream(path: str) -> Iterator[pa.RecordBatch]:
    with pa.OSFile(path, "rb") as source:
        yield from pa.ipc.open_stream(source)


def _split(images: pa.RecordBatch, shift: int, bits: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``images`` by bucket: ``bits`` bits of the key hash from bit ``shift``."""
    hashes = images.column("h")
    if shift:
        hashes = pc.shift_right(hashes, pa.scalar(shift, pa.uint64()))
    bucket = pc.bit_wise_and(hashes, pa.scalar((1 << bits) - 1, pa.uint64()))
    order = pc.sort_indices(bucket)
    ordered = images.take(order)
    counts = pc.value_counts(bucket)
    start = 0
    values, sizes = counts.field("values").to_pylist(), counts.field("counts").to_pylist()
    for value, count in sorted(zip(values, sizes, strict=True)):
        yield value, ordered.slice(start, count)
        start += count


def _seen_once(hashes: pa.Array | pa.ChunkedArray) -> pa.Array:
    counts = pc.value_counts(hashes)
    return counts.field("values").filter(pc.equal(counts.field("counts"), 1))


def _pair(images: pa.Table, pair_schema: pa.Schema = PAIR_SCHEMA) -> pa.Table:
    """The pair entries of a set of images holding every image of their hashes, sorted by position.

    A hash seen once as a pre-image and once as a post-image pairs its two images if they carry the
    same key (a hash shared by two keys leaves both updates unpaired: ``d`` + ``c``). Worked out on
    row indices; the images' text is copied once, into the entries.
    """
    pre = images.column("pre")
    hashes = images.column("h")
    pre_once = _seen_once(hashes.filter(pre))
    post_once = _seen_once(hashes.filter(pc.invert(pre)))
    if not len(pre_once) or not len(post_once):
        return pair_schema.empty_table()
    pairable = pre_once.filter(pc.is_in(pre_once, value_set=post_once))
    rows = pc.indices_nonzero(pc.is_in(hashes, value_set=pairable))
    if not len(rows):
        return pair_schema.empty_table()
    # each hash: its post-image (pre false), then its pre-image
    by_hash = pa.table({"h": hashes.take(rows), "pre": pre.take(rows), "row": rows})
    rows = by_hash.sort_by([("h", "ascending"), ("pre", "ascending")]).column("row")
    n = len(rows)
    posts = rows.take(pa.array(range(0, n, 2), pa.int64()))
    pres = rows.take(pa.array(range(1, n, 2), pa.int64()))
    keys = images.column("key")
    same = pc.equal(keys.take(posts), keys.take(pres))
    posts, pres = posts.filter(same), pres.filter(same)
    position = images.column("pos")
    post_pos, pre_pos = position.take(posts), position.take(pres)
    post_later = pc.greater(post_pos, pre_pos)
    m = len(posts)
    no_row = pa.nulls(m, pa.uint64())
    entries = pa.table(
        {
            "pos": pa.chunked_array(
                [pc.if_else(post_later, post_pos, pre_pos), pc.if_else(post_later, pre_pos, post_pos)]
            ),
            "pre": pa.chunked_array([pres.cast(pa.uint64()), no_row]),
            "post": pa.chunked_array([posts.cast(pa.uint64()), no_row]),
        }
    ).sort_by("pos")
    pre_rows, post_rows = entries.column("pre"), entries.column("post")
    image = images.column("image")
    return pa.table(
        {
            "pos": entries.column("pos"),
            "key": keys.take(post_rows),  # null at an earlier image: no event there
            "before": image.take(pre_rows),
            "after": image.take(post_rows),
        },
        schema=pair_schema,
    ).combine_chunks()


__all__ = [
    "DEFAULT_PAIRING_MEMORY_BYTES",
    "IMAGE_SCHEMA",
    "PAIR_SCHEMA",
    "SPILL_PREFIX",
    "UpdatePairs",
    "image_schemas",
]
