"""A table's location, spelled one way: what its storage is opened with and what names it.

A table URI is the identity of a table in progress records, Kafka keys and messages, so two
spellings of one location must give one string, and a password given in the URL must never be
part of it. Every entry point (the CLI, a config file, the library) normalises here.
"""

from __future__ import annotations

import os
import urllib.parse

from ..errors import InvalidTableUriError

__all__ = ["normalize_location", "normalize_table_uri", "without_password"]


def normalize_table_uri(uri: str) -> str:
    """A stable URI for a table: absolute ``file://`` for local paths, no trailing slash, no password.

    It is the identity of a table in progress records and Kafka keys, so two spellings of the same
    location (``./t``, ``/abs/t/``, ``file:///abs/t``) must give the same string, and credentials
    given in the URL (``s3://key:secret@bucket/t``) are not part of it.
    """
    return without_password(normalize_location(uri))


def normalize_location(uri: str) -> str:
    """:func:`normalize_table_uri`, credentials kept: what the filesystem is opened with."""
    if not uri or not uri.strip():
        raise InvalidTableUriError("empty table location", table=uri)
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        path = parsed.path if parsed.scheme == "file" else uri
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise InvalidTableUriError("file:// URL with a host is not supported", table=uri)
        return "file://" + os.path.abspath(os.path.expanduser(path)).rstrip("/")
    import fsspec  # only for an object store's location: a local table never loads it

    if parsed.scheme not in fsspec.available_protocols() and parsed.scheme not in fsspec.registry:
        raise InvalidTableUriError(f"unknown storage protocol {parsed.scheme!r}", table=uri)
    return uri.rstrip("/")


def without_password(uri: str) -> str:
    """``uri`` without the ``user:password@`` of its authority, if it has one.

    A URL may carry credentials (``s3://key:secret@bucket/t``); the table's identity is published
    to Kafka and printed, so it must not. A user part without a password stays: in
    ``abfs://container@account.dfs.core.windows.net/t`` it names the container.
    """
    parsed = urllib.parse.urlsplit(uri)
    userinfo, at, host = parsed.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return uri
    return urllib.parse.urlunsplit(parsed._replace(netloc=host))
