#!/usr/bin/env python3
"""Regenerate devkafka/registry_artifacts.json, the pinned runtime classpath behind `deltamirror local registry`.

Run by a maintainer when ``devkafka/registry_pom.xml`` changes (a new Apicurio Registry version), and
its output committed. It runs the same Maven build as ``deltamirror local registry start`` (strict
checksums against Maven Central) into a throwaway cache, then records each jar of the build's
``lib/`` by name, Maven repository path, size and SHA-256. At run time
:mod:`deltamirror.devkafka.registry` refuses a build whose ``lib/`` holds any other bytes.

    python scripts/pin_registry_artifacts.py --apicurio-version 2.4.2.Final --quarkus-version 2.16.4.Final
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "devkafka" / "registry_artifacts.json"
POM = REPO_ROOT / "devkafka" / "registry_pom.xml"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _repo_paths(m2: Path) -> dict[str, str]:
    """Quarkus names a lib jar ``<groupId>.<file name in the repository>``: map those names back."""
    out = {}
    for jar in m2.rglob("*.jar"):
        rel = jar.relative_to(m2)
        group = ".".join(rel.parts[:-3])
        out[f"{group}.{rel.name}"] = rel.as_posix()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--apicurio-version", required=True)
    parser.add_argument("--quarkus-version", required=True)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--cache", type=Path, default=None, help="XDG_CACHE_HOME of the build (default: a temp dir)"
    )
    args = parser.parse_args()

    pom = POM.read_text(encoding="utf-8")
    for version in (args.apicurio_version, args.quarkus_version):
        if version not in pom:
            print(f"{POM} does not name {version}: edit it first", file=sys.stderr)
            return 2
    runner = f"apicurio-registry-runner-{args.apicurio_version}-runner.jar"
    if not re.search(
        rf"<artifactId>apicurio-registry-runner</artifactId>\s*<version>{re.escape(args.apicurio_version)}<",
        pom,
    ):
        print(f"{POM}: the project's version must be {args.apicurio_version}", file=sys.stderr)
        return 2
    cache = args.cache or Path(tempfile.mkdtemp(prefix="pin-registry-"))
    os.environ["XDG_CACHE_HOME"] = str(cache)
    # the build reads the versions from the JSON it is about to regenerate: write its head first
    head = {
        "apicurio_version": args.apicurio_version,
        "quarkus_version": args.quarkus_version,
        "runner_jar": runner,
        "generated_by": "scripts/pin_registry_artifacts.py",
        "lib": [],
    }
    args.output.write_text(json.dumps(head, indent=2) + "\n", encoding="utf-8")

    from deltamirror.devkafka.registry import build, maven_repo

    app = build(verify=False)
    repo_paths = _repo_paths(maven_repo())
    lib = []
    for jar in sorted((app / "lib").iterdir()):
        # Quarkus rewrites a few jars at build time ("modified-<name>", the same bytes every build)
        repo_path = repo_paths.get(jar.name.removeprefix("modified-"))
        if repo_path is None:
            print(f"{jar.name}: no such jar in {maven_repo()}", file=sys.stderr)
            return 1
        lib.append(
            {
                "file_name": jar.name,
                "repo_path": repo_path,
                "sha256": _sha256(jar),
                "size": jar.stat().st_size,
            }
        )
    doc = {**head, "lib": lib}
    args.output.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    total = sum(j["size"] for j in lib) / 1e6
    print(f"wrote {args.output}: {len(lib)} jars, {total:.0f} MB (build cache {cache})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
