"""What `pip install deltamirror[...]` brings: each object-store extra installs the fsspec
implementation of the URLs the README promises, and a missing one is named in the error."""

from __future__ import annotations

import tomllib
from pathlib import Path

import fsspec
import pytest
from fsspec.registry import known_implementations
from packaging.requirements import Requirement

from deltamirror.core.errors import InvalidTableUriError
from deltamirror.core.storage import TableStorage

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize(("extra", "scheme"), [("s3", "s3"), ("gcs", "gs"), ("azure", "abfs")])
def test_an_object_store_extra_installs_the_fsspec_implementation_of_its_urls(
    extra: str, scheme: str
) -> None:
    implementation = known_implementations[scheme]["class"].split(".", 1)[0]
    assert implementation in {Requirement(r).name for r in EXTRAS[extra]}


def test_a_url_whose_storage_package_is_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*_: object, **__: object) -> None:
        raise ImportError("Install s3fs to access S3")

    monkeypatch.setattr(fsspec.core, "url_to_fs", missing)
    with pytest.raises(InvalidTableUriError, match=r"pip install 'deltamirror\[s3\]'"):
        _ = TableStorage("s3://bucket/table").fs
