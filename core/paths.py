"""Which files a table's log may name: the table root's, and those under prefixes the user allowed.

The log is untrusted: a path in it (``add``, ``remove``, ``cdc``, a deletion vector, a sidecar) may
try ``../``, its URL-encoded spellings, an absolute path, another host or bucket. A path is judged
by what it names after decoding and normalising, compared with the root by scheme, authority and
path components, never by string prefix (``/t/tbl`` does not hold ``/t/tbl2``). These rules are
pure string work; :class:`~deltamirror.core.storage.TableStorage` applies them before every open
and, on a local disk, also checks the real path (symbolic links) when it opens.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from deltamirror.core.compute import pc

from .errors import CorruptLogError, InvalidArgumentError, PathOutsideTableError

#: one store under several scheme names (delta-spark writes s3a:// where a user opens s3://)
_SCHEME_FAMILY = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs", "local": "file"}
#: a URI scheme as RFC 3986 spells it; one letter is a Windows drive, not a scheme
_URI_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):")
#: a relative path that needs more than joining to the root (Arrow's RE2 syntax, for whole columns)
_NEEDS_PARSING = r"^$|^/|[%:\x00]|\.\."
SIDECAR_DIR = "_delta_log/_sidecars"


@dataclass(frozen=True, slots=True)
class Place:
    """Where a path points: store (scheme family), authority and a normalised absolute path."""

    family: str
    netloc: str
    path: str

    def holds(self, other: Place) -> bool:
        """True when ``other`` is strictly inside this place, compared by path components."""
        if other.family != self.family or other.netloc != self.netloc:
            return False
        return inside(other.path, self.path)


def inside(path: str, folder: str) -> bool:
    """``path`` strictly below ``folder``; both normalised (no ``.``/``..``/empty segments), so a
    prefix ending at a separator is a component comparison."""
    if folder == "/":
        return len(path) > 1 and path[0] == "/"
    n = len(folder)
    return path.startswith(folder) and path[n : n + 1] == "/" and len(path) > n + 1


def normalised(path: str) -> str | None:
    """An absolute ``/``-path without ``.``, ``..`` or empty segments; None if ``..`` climbs past ``/``."""
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(part)
    return "/" + "/".join(out)


def redact_userinfo(uri: str) -> str:
    """``uri`` with the password of its authority replaced, for error messages and logs."""
    m = _URI_SCHEME.match(uri)
    if m is None or not uri[m.end() :].startswith("//"):
        return uri
    netloc_start = m.end() + 2
    netloc_end = uri.find("/", netloc_start)
    netloc_end = len(uri) if netloc_end < 0 else netloc_end
    userinfo, at, host = uri[netloc_start:netloc_end].rpartition("@")
    if not at or ":" not in userinfo:  # abfss://container@account: a name, not a secret
        return uri
    return f"{uri[:netloc_start]}{userinfo.split(':', 1)[0]}:***@{host}{uri[netloc_end:]}"


def _split(uri: str, m: re.Match[str]) -> tuple[str, str, str]:
    """(scheme family, authority, path) of a URI; ``file:/x`` has no authority, nor has localhost."""
    family = _SCHEME_FAMILY.get(m.group(1).lower(), m.group(1).lower())
    rest = uri[m.end() :]
    if not rest.startswith("//"):
        return family, "", rest
    netloc, slash, path = rest[2:].partition("/")
    if family == "file" and netloc.lower() == "localhost":
        netloc = ""
    return family, netloc, slash + path


class PathRules:
    """The root of one table (a normalised URI) and the prefixes allowed outside it."""

    def __init__(self, table_uri: str, allowed_path_prefixes: Iterable[str] = ()) -> None:
        self.table = table_uri
        m = _URI_SCHEME.match(table_uri)
        assert m is not None, table_uri  # normalize_table_uri gives a URL
        self.scheme = m.group(1).lower()
        family, netloc, path = _split(table_uri, m)
        self.root = Place(family, netloc, normalised(path) or "/")
        self.allowed = tuple(self._allowed_place(p) for p in allowed_path_prefixes)

    def _allowed_place(self, prefix: str) -> Place:
        """An allowed prefix as a place: a URI on the table's store, or a local path."""
        if not isinstance(prefix, str) or not prefix.strip():
            raise InvalidArgumentError("an allowed path prefix is empty", table=self.table)
        m = _URI_SCHEME.match(prefix)
        if m is None:
            family, netloc, path = "file", "", os.path.abspath(os.path.expanduser(prefix))
        else:
            family, netloc, path = _split(prefix, m)
            path = urllib.parse.unquote(path)
        if family != self.root.family:
            raise InvalidArgumentError(
                f"allowed path prefix {redact_userinfo(prefix)!r} is not on the table's storage "
                f"({self.scheme}://): its files could not be read through the table's filesystem",
                table=self.table,
            )
        return Place(family, netloc, normalised("/" + path) or "/")

    @staticmethod
    def is_plain(p: str, literal: bool) -> bool:
        """A relative path with nothing to decode, climb or compare: joined to the root as it is."""
        return (
            bool(p)
            and ".." not in p
            and ":" not in p
            and p[0] != "/"
            and (literal or "%" not in p)
            and "\x00" not in p
        )

    def place(self, p: str, kind: str, literal: bool) -> Place:
        """Where ``p`` points, if that is under the root or an allowed prefix.

        Relative paths are URL-encoded (decoded once) and relative to the root (a ``sidecar``'s to
        ``_delta_log/_sidecars``); ``literal`` ones are relative and not encoded. Absolute paths are
        URIs or ``/x`` on the table's own store. PathOutsideTableError for anything leading out,
        CorruptLogError for what is not a path at all.
        """
        if not isinstance(p, str) or not p:
            raise CorruptLogError(f"{kind} path is empty or not a string", table=self.table)
        shown = redact_userinfo(p)
        m = None if literal else _URI_SCHEME.match(p)
        if m is not None:
            family, netloc, path = _split(p, m)
        else:
            family, netloc, path = self.root.family, self.root.netloc, p
        if not literal:
            try:
                path = urllib.parse.unquote(path, errors="strict")
            except UnicodeDecodeError:
                raise CorruptLogError(
                    f"{kind} path {shown!r} is not valid URL-encoded UTF-8", table=self.table
                ) from None
        if "\x00" in path:
            raise CorruptLogError(f"{kind} path {shown!r} holds a NUL character", table=self.table)
        if not path.startswith("/"):
            if m is not None:  # 'file:x': nothing it could be relative to
                raise self.outside(kind, shown)
            base = self.root.path if kind != "sidecar" else f"{self.root.path}/{SIDECAR_DIR}"
            path = f"{base}/{path}"
        normal = normalised(path)
        if normal is None:
            raise self.outside(kind, shown)
        place = Place(family, netloc, normal)
        if not (self.root.holds(place) or any(a.holds(place) for a in self.allowed)):
            raise self.outside(kind, shown)
        return place

    def outside(self, kind: str, shown: str) -> PathOutsideTableError:
        return PathOutsideTableError(
            f"{kind} {shown!r} lies outside the table root and every allowed prefix; not read "
            "(if the table's files really live there, e.g. a shallow clone, allow that location "
            "with --allow-path-prefix URI or allowed_path_prefixes)",
            table=self.table,
        )

    def check_column(self, paths: pa.Array | pa.ChunkedArray, kind: str) -> None:
        """:meth:`place` over a whole column: one scan by Arrow kernels, then only the paths that
        are not plain relative ones one by one (distinct values only)."""
        if len(paths) == 0:
            return
        if paths.null_count:
            raise CorruptLogError(f"a {kind} has no path", table=self.table)
        odd = pc.match_substring_regex(paths, _NEEDS_PARSING)
        if not pc.any(odd).as_py():
            return
        for path in pc.unique(pc.filter(paths, odd)).to_pylist():
            self.place(path, kind, literal=False)
