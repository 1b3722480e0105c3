"""Row-level change events: the change data feed as Debezium-style records (the wire format only).

A record per changed row on ``deltamirror.<name>.changes``, with the envelope Debezium's
connectors publish, so that Debezium-aware consumers (Kafka Connect's ``JsonConverter`` with
``schemas.enable=true`` and ``ExtractNewRecordState``, Flink's ``debezium-json``, Spark's
``from_json``) read it unchanged::

    key   {"id": 7}                                  (the configured key columns; else {"_row_id": n} on
                                                      a table with row tracking; else the whole row)
    value {"before": {...}|null, "after": {...}|null, "op": "c"|"u"|"d"|"r", "ts_ms": <commit ms>,
           "source": {"version", "connector": "deltamirror", "name", "ts_ms", "snapshot": "true"|"false"|"last",
                      "db", "table", "table_id", "delta_version", "index"},
           "transaction": {"id": "<table_id>:<version>", "total_order": n, "data_collection_order": n}}

Two formats, each one class of :mod:`deltamirror.mirror.records.row_formats` chosen once from the
setting (:class:`~deltamirror.mirror.records.row_formats.RowChangeSerializer`): plain JSON
(``json``, the payload alone) and JSON with an inline Connect schema (``json-schema``:
``{"schema": ..., "payload": ...}`` exactly as ``JsonConverter`` writes and reads it with
``schemas.enable=true``; struct names ``<topic>.Envelope`` / ``<topic>.Value`` / ``<topic>.Key``).
This module builds the payload's text, the same in every format; the serializer gives the bytes. A
tombstone is a record with a null value (Kafka null, in both formats).

Type mapping (Arrow, as core reads Delta, to Connect; the payload is the same in both formats except
decimals): integers int8/16/32/64, float/double float32/float64 (NaN and infinities as the strings
``"NaN"``, ``"Infinity"``, ``"-Infinity"`` in plain JSON, which has no such numbers; refused with
:class:`~deltamirror.mirror.errors.UnrepresentableValueError` in ``json-schema``, where
JsonConverter would read the text as 0.0), boolean, string, binary as
``bytes`` (base64 text), date as ``int32`` days since the epoch (``io.debezium.time.Date``),
timestamp and timestamp_ntz as ``int64`` microseconds since the epoch
(``io.debezium.time.MicroTimestamp``; TIMESTAMP values are UTC), decimal as
``org.apache.kafka.connect.data.Decimal`` (base64 of the big-endian two's-complement unscaled value,
``scale`` and ``connect.decimal.precision`` parameters: JsonConverter's default decimal format) in
``json-schema`` and as an exact decimal string (``"12.30"``, as Debezium's
``decimal.handling.mode=string``) in plain JSON; struct as a Connect struct, array as array, map
with string keys as a JSON object, other maps as ``[[key, value], ...]`` (JsonConverter's form).

Pairing of updates (see :class:`VersionRows`): a version's ``update_preimage``/``update_postimage``
become one ``"u"`` record only when key columns are configured and the key is seen exactly once as
a pre-image and once as a post-image in the version; otherwise (no key, or a key met more than once)
the pre-image is published as ``"d"`` and the post-image as ``"c"``. Images are never paired by
position. Pairing holds a bounded amount of memory (:mod:`deltamirror.mirror.records.row_pairing`); a
record larger than the changes topic accepts is refused before it is produced
(:class:`~deltamirror.mirror.errors.RecordTooLargeError`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import closing
from typing import Any, cast

import pyarrow as pa

from deltamirror.core.compute import pc
from deltamirror.core.errors import CorruptDataFileError
from deltamirror.core.row_tracking import ROW_COMMIT_VERSION, ROW_ID

from ..errors import RecordTooLargeError, SchemaRegistryError, UnrepresentableValueError
from .connect_types import column_values, connect_schema
from .record import Record
from .row_formats import ROW_CHANGES_FORMATS, BinaryRowChangeSerializer, RowChangesFormat
from .row_pairing import DEFAULT_PAIRING_MEMORY_BYTES, UpdatePairs
from .row_records import (
    RowChangesOptions,
    transaction_id,
    transaction_record,
)

CHANGE_TYPE = "_change_type"
#: the change feed's own columns: never part of a row's image
CDF_COLUMNS = frozenset({"_change_type", "_commit_version", "_commit_timestamp"})
#: with row ids (row tracking): the change feed's columns and the row id columns
CDF_AND_ROW_ID_COLUMNS = CDF_COLUMNS | {ROW_ID, ROW_COMMIT_VERSION}
CONNECTOR = "deltamirror"

_UPDATE_IMAGES = pa.array(["update_preimage", "update_postimage"])
_OP_OF_CHANGE = {"insert": "c", "delete": "d", "update_preimage": "d", "update_postimage": "c"}
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _row_json_encoder() -> Callable[[Any], str]:
    """``_JSON.encode`` for the per-row hot path, about 3x faster a call: ``JSONEncoder.encode``
    builds a new C encoder on every call. This one is built once, with ``_JSON``'s settings (no
    circular check: Arrow values cannot hold cycles); the same text, checked here, or ``_JSON.encode``."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _JSON.encode
    try:
        iterencode = make(
            None, _JSON.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
        )
    except TypeError:  # another interpreter's signature
        return _JSON.encode

    def encode(obj: Any) -> str:
        return "".join(iterencode(obj, 0))

    sample = {"a": 1, "b": "\u00e9\n", "c": [1.5, None, True], "d": {"e": -2}}
    return encode if encode(sample) == _JSON.encode(sample) else _JSON.encode


_encode_row_json = _row_json_encoder()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("deltamirror")
    except Exception:  # not installed (a source tree): still a string, as Debezium's source.version
        return "0+unknown"


class RowChangeEncoder:
    """Encodes the rows of one schema (the table's columns, as the change feed gives them)."""

    def __init__(self, options: RowChangesOptions, schema: pa.Schema) -> None:
        self.options = options
        feed_columns = CDF_AND_ROW_ID_COLUMNS if options.row_ids else CDF_COLUMNS
        self.columns = [f.name for f in schema if f.name not in feed_columns]
        fields = {f.name: f for f in schema}
        missing = [c for c in options.key_columns if c not in fields]
        if missing:
            raise KeyError(", ".join(missing))
        self.key_columns = list(options.key_columns) or self.columns
        self._version = _version()
        #: (version, ts_ms, snapshot) -> the constant parts of an event's text
        self._templates: dict[tuple[int, int, str], tuple[str, str, str]] = {}
        self.serializer = options.serializer(
            options.changes_topic,
            fields,
            self.columns,
            self.key_columns,
            table_schema=options.table_schema,
            registry=options.registry,
        )
        #: what a row image is (JSON text, or a binary format's bytes): what pairing holds
        self.image_type = self.serializer.image_type
        #: the record key around a key payload (the format's)
        self.key = self.serializer.key
        self._binary: BinaryRowChangeSerializer | None = None
        if self.image_type != pa.large_string():
            self._binary = cast(BinaryRowChangeSerializer, self.serializer)
            #: (version, ts_ms, snapshot) -> the source and transaction blocks of a binary event
            self._blocks: dict[tuple[int, int, str], tuple[dict[str, Any], str]] = {}
            self.rows = self._binary_rows  # type: ignore[method-assign,assignment]
            self.key_payloads = self._binary_key_payloads  # type: ignore[method-assign]
            self.value = self._binary_value  # type: ignore[method-assign,assignment]
        else:
            self._frame_value = self.serializer.value

    def rows(self, batch: pa.RecordBatch) -> tuple[list[str], list[str], list[bytes]]:
        """A batch's change types, row images (their JSON text) and key payloads (the pairing identity)."""
        convert = self.serializer.column_values
        values: dict[str, list[Any]] = {}
        for name in self.columns:
            try:
                values[name] = convert(batch.column(name))
            except UnrepresentableValueError as exc:
                raise UnrepresentableValueError(f"column {name!r}: {exc.message}", column=name) from None
        encode, names = _encode_row_json, self.columns
        images = [encode(dict(zip(names, row, strict=True))) for row in zip(*values.values(), strict=True)]
        if not self.columns:
            images = ["{}"] * batch.num_rows
        if self.key_columns == self.columns:  # the whole row is the key: its text is the key's
            keys = [image.encode() for image in images]
        else:
            keys = self.key_payloads(batch, values)
        change_types = batch.column(CHANGE_TYPE).to_pylist()
        return change_types, images, keys

    def key_payloads(self, batch: pa.RecordBatch, values: dict[str, list[Any]] | None = None) -> list[bytes]:
        """The key payload of each row (JSON of the key columns), from ``values`` if converted already."""
        if not self.key_columns:
            return [b"{}"] * batch.num_rows
        convert = self.serializer.column_values
        columns = [
            values[c] if values and c in values else convert(batch.column(c)) for c in self.key_columns
        ]
        names = self.key_columns
        encode = _encode_row_json
        return [encode(dict(zip(names, k, strict=True))).encode() for k in zip(*columns, strict=True)]

    def _values(self, batch: pa.RecordBatch, columns: list[str]) -> dict[str, list[Any]]:
        convert = self.serializer.column_values
        values: dict[str, list[Any]] = {}
        for name in columns:
            try:
                values[name] = convert(batch.column(name))
            except UnrepresentableValueError as exc:
                raise UnrepresentableValueError(f"column {name!r}: {exc.message}", column=name) from None
        return values

    def _binary_rows(self, batch: pa.RecordBatch) -> tuple[list[str], list[bytes], list[bytes]]:
        """:meth:`rows` of a binary format: the images and keys are the format's bytes."""
        assert self._binary is not None
        values = self._values(batch, self.columns)
        n = batch.num_rows
        images = self._binary.images(values, n)
        keys = images if self.key_columns == self.columns else self._binary_key_payloads(batch, values)
        return batch.column(CHANGE_TYPE).to_pylist(), images, keys

    def _binary_key_payloads(
        self, batch: pa.RecordBatch, values: dict[str, list[Any]] | None = None
    ) -> list[bytes]:
        assert self._binary is not None
        have = values or {}
        own = self._values(batch, [c for c in self.key_columns if c not in have])
        return self._binary.key_images({**have, **own}, batch.num_rows)

    def _binary_value(
        self,
        op: str,
        before: bytes | None,
        after: bytes | None,
        *,
        version: int,
        ts_ms: int,
        index: int,
        snapshot: str = "false",
    ) -> bytes:
        """:meth:`value` of a binary format: the envelope's parts, the format's bytes."""
        assert self._binary is not None
        blocks = self._blocks.get((version, ts_ms, snapshot))
        if blocks is None:
            blocks = self._blocks[(version, ts_ms, snapshot)] = self._source_block(version, ts_ms, snapshot)
        source, txn_id = blocks
        n = index + 1
        return self._binary.event(
            op,
            before,
            after,
            {**source, "index": index},
            ts_ms,
            {"id": txn_id, "total_order": n, "data_collection_order": n},
        )

    def _source_block(self, version: int, ts_ms: int, snapshot: str) -> tuple[dict[str, Any], str]:
        """Debezium's ``source`` block of a version's events (without ``index``), and its transaction id."""
        o = self.options
        source = {
            "version": self._version,
            "connector": CONNECTOR,
            "name": o.table_name,
            "ts_ms": ts_ms,
            "snapshot": snapshot,
            "db": "delta",
            "table": o.table_name,
            "table_id": o.table_id,
            "delta_version": version,
        }
        return source, transaction_id(o.table_id, version)

    def value(
        self,
        op: str,
        before: str | None,
        after: str | None,
        *,
        version: int,
        ts_ms: int,
        index: int,
        snapshot: str = "false",
    ) -> bytes:
        """One change event (``index`` counts the version's events from 0); ``before`` and
        ``after`` are row images as JSON text (:meth:`rows`), None for null.

        The parts that are the same for every event of a version are encoded once per version;
        the text is what ``json.dumps`` of the envelope gives (same keys, same order).
        """
        template = self._templates.get((version, ts_ms, snapshot))
        if template is None:
            template = self._templates[(version, ts_ms, snapshot)] = self._template(version, ts_ms, snapshot)
        source, middle, orders = template
        n = str(index + 1)
        text = (
            f'{{"before":{before or "null"},"after":{after or "null"},"source":{source}{index}}},"op":"{op}"'
            f"{middle}{n}{orders}{n}}}}}"
        )
        return self._frame_value(text.encode())

    def _template(self, version: int, ts_ms: int, snapshot: str) -> tuple[str, str, str]:
        source, tid = self._source_block(version, ts_ms, snapshot)
        txn_id = _JSON.encode(tid)
        return (
            _JSON.encode(source)[:-1] + ',"index":',
            f',"ts_ms":{ts_ms},"transaction":{{"id":{txn_id},"total_order":',
            ',"data_collection_order":',
        )


# --- one version's records --------------------------------------------------------------------


class VersionRows:
    """The records of one version's change rows, in a deterministic order (a restart skips a prefix).

    ``batches`` must give the same rows in the same order on every call (core's change feed does).
    With key columns a first read hands the version's update images to
    :class:`~deltamirror.mirror.records.row_pairing.UpdatePairs`, which pairs them within
    ``pairing_memory_bytes`` (spilling to temporary Arrow files in ``spill_dir`` beyond it); the
    second read emits, the ``"u"`` of a pair at the later image's place. The order depends on the
    rows alone, never on the budget. The stream is BEGIN, the events (each delete followed by a
    tombstone when ``tombstones``), END — nothing at all for a version without row changes.
    """

    def __init__(
        self,
        options: RowChangesOptions,
        batches: Callable[[], Iterable[pa.RecordBatch]],
        *,
        version: int,
        ts_ms: int,
        op_override: str | None = None,
        snapshot: Callable[[bool], str] | None = None,
        may_have_updates: bool = True,
        pairing_memory_bytes: int = DEFAULT_PAIRING_MEMORY_BYTES,
        expected_image_bytes: int | None = None,
        spill_dir: str | None = None,
    ) -> None:
        self.options = options
        self.batches = batches
        self.version = version
        self.ts_ms = ts_ms
        self.op_override = op_override
        self.snapshot = snapshot or (lambda last: "false")
        self.may_have_updates = may_have_updates
        self.pairing_memory_bytes = pairing_memory_bytes
        #: an estimate of the update images' size (sets the first bucket count; None: found out)
        self.expected_image_bytes = expected_image_bytes
        self.spill_dir = spill_dir
        #: records larger than this (key + value bytes) are refused before producing (None: no check)
        self.max_record_bytes: int | None = None
        self._encoders: dict[pa.Schema, RowChangeEncoder] = {}
        #: what :meth:`prepare` read ahead: the first list of records and the rest's generator
        self._prepared: tuple[list[Record] | None, Generator[list[Record], None, None]] | None = None
        #: events of the version (known once :meth:`records` is exhausted)
        self.event_count = 0
        #: spill buckets the last pairing used (0: paired in memory)
        self.buckets = 0

    def encoder(self, schema: pa.Schema) -> RowChangeEncoder:
        enc = self._encoders.get(schema)
        if enc is None:
            enc = self._encoders[schema] = RowChangeEncoder(self.options, schema)
        return enc

    @property
    def pairing_pass(self) -> bool:
        """True when :meth:`records` reads the version once before its first record (to pair updates)."""
        return bool(self.options.key_columns) and self.may_have_updates

    def _rows(self, enc: RowChangeEncoder, batch: pa.RecordBatch) -> tuple[list[str], list[str], list[bytes]]:
        try:
            return enc.rows(batch)
        except UnrepresentableValueError as exc:
            raise UnrepresentableValueError(
                exc.message, table=self.options.table_name, version=self.version
            ) from None

    def _pairs(self) -> UpdatePairs | None:
        """The version's update pairs (None: no pairing), from a first read of its rows."""
        if not self.pairing_pass:
            return None
        pairs: UpdatePairs | None = None
        try:
            pos = 0
            for batch in self.batches():
                updates = pc.is_in(batch.column(CHANGE_TYPE), value_set=_UPDATE_IMAGES)
                where = pc.indices_nonzero(updates)
                if len(where):
                    enc = self.encoder(batch.schema)
                    if pairs is None:
                        pairs = self._new_pairs(enc.image_type)
                    images = batch.take(where)
                    _, texts, keys = self._rows(enc, images)
                    pre = pc.equal(images.column(CHANGE_TYPE), "update_preimage")
                    pairs.add(
                        pa.record_batch(
                            [pc.add(where.cast(pa.int64()), pos), _hashes(keys), pre, keys, texts],
                            schema=pairs.image_schema,
                        )
                    )
                pos += batch.num_rows
            if pairs is None:
                pairs = self._new_pairs(pa.large_string())
            pairs.finish()
        except BaseException:
            if pairs is not None:
                pairs.close()
            raise
        self.buckets = pairs.buckets
        return pairs

    def _new_pairs(self, image_type: pa.DataType) -> UpdatePairs:
        return UpdatePairs(
            self.pairing_memory_bytes,
            expected_bytes=self.expected_image_bytes,
            spill_dir=self.spill_dir,
            image_type=image_type,
        )

    def prepare(self) -> None:
        """Make the version's first records now, held for :meth:`records`: a registry format's
        schemas are registered (or refused: :class:`SchemaRegistryError`) before the caller
        publishes anything else of the version, its actions included."""
        if self._prepared is None:
            rest = self._all_records()
            self._prepared = (next(rest, None), rest)

    def close(self) -> None:
        """Let go of what :meth:`prepare` read ahead, if :meth:`records` did not take it."""
        if self._prepared is not None:
            rest, self._prepared = self._prepared[1], None
            rest.close()

    def records(self) -> Iterator[list[Record]]:
        """The version's records, a list per input batch (BEGIN with the first, END alone last)."""
        if self._prepared is None:
            yield from self._all_records()
            return
        (first, rest), self._prepared = self._prepared, None
        with closing(rest):
            if first is not None:
                yield first
            yield from rest

    def _all_records(self) -> Generator[list[Record], None, None]:
        pairs = self._pairs()
        try:
            yield from self._records(pairs)
        except SchemaRegistryError as exc:  # a registry format's: name the table and version
            if exc.table is not None:
                raise
            raise type(exc)(
                exc.message, table=self.options.table_name, version=self.version, **exc.context
            ) from exc
        finally:
            if pairs is not None:
                pairs.close()

    def _records(self, pairs: UpdatePairs | None) -> Iterator[list[Record]]:
        o = self.options
        topic, tombstones = o.changes_topic, o.tombstones
        index = 0
        pos = 0
        begun = False
        batches = iter(self.batches())
        batch = next(batches, None)
        while batch is not None:
            following = next(batches, None)
            enc = self.encoder(batch.schema)
            n = batch.num_rows
            found = pairs.take(pos, pos + n) if pairs is not None else None
            slots: list[int] | None = None
            if found is not None and found.num_rows:
                rel = pc.subtract(found.column("pos"), pos)
                kinds = batch.column(CHANGE_TYPE).take(rel)
                if not pc.all(pc.is_in(kinds, value_set=_UPDATE_IMAGES)).as_py():
                    raise CorruptDataFileError(
                        "the version's update images changed while it was read",
                        table=o.table_name,
                        version=self.version,
                    )
                slots = [-1] * n
                for j, r in enumerate(rel.to_pylist()):
                    slots[r] = j
                keep = pa.array([s < 0 for s in slots])
                types, images, keys = self._rows(enc, batch.filter(keep))
                pair_keys = found.column("key").to_pylist()
                befores = found.column("before").to_pylist()
                afters = found.column("after").to_pylist()
            else:
                types, images, keys = self._rows(enc, batch)
            out: list[Record] = []
            if not begun and n:
                begun = True
                out.append(transaction_record(o, self.version, self.ts_ms, None))
            last_rows = following is None
            k = 0
            for i in range(n):
                before: str | None
                after: str | None
                if slots is not None and slots[i] >= 0:
                    j = slots[i]
                    pair_key = pair_keys[j]
                    if pair_key is None:
                        continue  # the earlier image of a pair: the "u" goes out at the later one
                    op, key, before, after = "u", pair_key, befores[j], afters[j]
                else:
                    kind, image, key = types[k], images[k], keys[k]
                    k += 1
                    op = self.op_override or _OP_OF_CHANGE.get(kind, "")
                    if not op:
                        raise CorruptDataFileError(
                            f"change row with _change_type {kind!r} (none of insert, delete, "
                            "update_preimage, update_postimage): no change event can say it",
                            table=o.table_name,
                            version=self.version,
                        )
                    before, after = (image, None) if op == "d" else (None, image)
                snap = self.snapshot(last_rows and i == n - 1)
                record_key = enc.key(key)
                value = enc.value(
                    op, before, after, version=self.version, ts_ms=self.ts_ms, index=index, snapshot=snap
                )
                if self.max_record_bytes is not None and len(record_key) + len(value) > self.max_record_bytes:
                    raise self._too_large(key, len(record_key) + len(value), index)
                out.append(Record(value, record_key, None, topic))
                index += 1
                if op == "d" and tombstones:
                    out.append(Record(None, record_key, None, topic))
            if out:
                yield out
            pos += n
            batch = following
        if pairs is not None and pairs.left_over():  # rows changed between the two reads
            raise CorruptDataFileError(
                "the version's update images changed while it was read",
                table=o.table_name,
                version=self.version,
            )
        self.event_count = index
        if begun:
            yield [transaction_record(o, self.version, self.ts_ms, index)]

    def _too_large(self, key: bytes, size: int, index: int) -> RecordTooLargeError:
        text = key.decode(errors="replace")
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(key)} bytes)"
        o = self.options
        return RecordTooLargeError(
            f"row change of key {shown} is {size} bytes, larger than topic {o.changes_topic} accepts "
            f"({self.max_record_bytes}); raise the topic's max.message.bytes and max_record_bytes",
            table=o.table_name,
            version=self.version,
            index=index,
        )


def _hashes(keys: list[bytes]) -> pa.Array:
    """64-bit hashes of key payloads, the same in every process (a restart must pair as the run before)."""
    return pa.array(
        [int.from_bytes(hashlib.blake2b(k, digest_size=8).digest(), "little") for k in keys], pa.uint64()
    )


def skip_records(chunks: Iterable[list[Record]], count: int) -> Generator[list[Record], None, None]:
    """``chunks`` without their first ``count`` records (those a restart finds published already)."""
    try:
        for chunk in chunks:
            if count >= len(chunk):
                count -= len(chunk)
                continue
            yield chunk[count:] if count else chunk
            count = 0
    finally:  # a stop or an error ends the version's stream: its spill files go now
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


__all__ = [
    "CONNECTOR",
    "ROW_CHANGES_FORMATS",
    "RowChangeEncoder",
    "RowChangesFormat",
    "RowChangesOptions",
    "VersionRows",
    "column_values",
    "connect_schema",
    "skip_records",
    "transaction_id",
    "transaction_record",
]
