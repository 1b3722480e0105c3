"""Build (or reuse) the synthetic many-files Delta table the snapshot benchmark loads.

The generator itself lives in ``tests/support/synthetic.py`` so that the memory test and this
benchmark load tables of the same shape; this script adds ``tests/`` to ``sys.path`` to reach it.
A freshly written table is opened once with delta-rs (``deltalake``) to prove it is a table another
engine reads with the same number of active files, and a manifest beside it records the parameters
so later runs reuse it.

    python bench/make_checkpoint_table.py [--files 1000000] [--commits 100] [--force]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
DATA = BENCH / ".data"
sys.path.insert(0, str(BENCH.parent / "tests"))

from support.synthetic import write_checkpoint_table  # noqa: E402


def table_dir(n_files: int, n_commits: int, data_dir: Path = DATA) -> Path:
    return data_dir / f"checkpoint_{n_files}_files_{n_commits}_commits"


def verify_with_delta_rs(root: Path, expected_version: int, expected_files: int) -> int:
    """Open the table with delta-rs; it must see the version and active-file count we wrote."""
    from deltalake import DeltaTable

    dt = DeltaTable(str(root))
    count = int(dt.get_add_actions().num_rows)
    if dt.version() != expected_version or count != expected_files:
        raise SystemExit(
            f"delta-rs reads version {dt.version()} with {count} files; "
            f"the generator wrote version {expected_version} with {expected_files}"
        )
    return count


def ensure_table(
    n_files: int, n_commits: int, *, data_dir: Path = DATA, force: bool = False, quiet: bool = False
) -> dict[str, Any]:
    """The manifest of a table with these parameters, generating and verifying it if needed."""
    root = table_dir(n_files, n_commits, data_dir)
    manifest_path = root.with_suffix(".json")
    if not force and manifest_path.exists() and (root / "_delta_log").is_dir():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        if manifest.get("checkpoint_files") == n_files and manifest.get("commits") == n_commits:
            return manifest
    if root.exists():
        shutil.rmtree(root)
    data_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    table = write_checkpoint_table(root, n_files, n_commits)
    generated = time.perf_counter() - started
    started = time.perf_counter()
    verify_with_delta_rs(root, table.version, table.active_files)
    verified = time.perf_counter() - started
    manifest = {**table.to_json(), "generate_s": round(generated, 2), "delta_rs_verify_s": round(verified, 2)}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    if not quiet:
        size_mb = Path(table.checkpoint).stat().st_size / 2**20
        print(
            f"wrote {root} in {generated:.1f} s: checkpoint v{table.checkpoint_version} "
            f"({table.checkpoint_files} files, {size_mb:.0f} MB), {table.commits} commits, "
            f"{table.active_files} active files at v{table.version}; delta-rs agrees ({verified:.1f} s)"
        )
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=1_000_000, help="active files in the checkpoint")
    parser.add_argument("--commits", type=int, default=100, help="JSON commits after the checkpoint")
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--force", action="store_true", help="regenerate even if the table exists")
    args = parser.parse_args(argv)
    manifest = ensure_table(args.files, args.commits, data_dir=args.data_dir, force=args.force)
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
