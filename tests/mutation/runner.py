"""Runs mutation cases through the library and the CLI and classifies every result.

The CLI runs in-process (``deltamirror.cli.main.main(argv)`` with stdout/stderr captured and the
exit code taken from its return value or SystemExit), which is far cheaper than a process per
command; ``subprocess_mismatches`` re-runs a sample as real processes to show the two agree.

Each (case, command) is classified against the case's expectation (see core.py). Failures:
``traceback`` (an exception that is not a DeltaMirrorError, exit 1 for bad input, any exit code
other than 0/2), ``timeout``, ``wrong-output`` (exit 0 where a refusal was due, an output that
differs where none should, a missing mutated value, output that is not strict JSON),
``over-refused`` (exit 2 for input the protocol allows), ``bad-refusal`` (exit 2 but not one line,
or not naming the file/line/field), ``read-outside-root`` (inotify saw a file outside the root
opened, or a canary's content reached an output), ``secret-printed``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mutation import logs as ml
from mutation.core import CLI_COMMANDS, Case, Env
from mutation.exec import LIB_COMMANDS, OpenWatch, Result, dump_json, run_command

OK = ("refused", "unchanged", "faithful", "accepted", "consistent", "open")
FAILURES = (
    "traceback",
    "timeout",
    "wrong-output",
    "over-refused",
    "bad-refusal",
    "read-outside-root",
    "secret-printed",
)
ORDERED = {"history", "events", "lib.history"}  # outputs whose order is part of the answer
TIME_FIELDS = {
    "snapshot": ("timestamp", "timestampSource"),
    "history": ("timestamp", "timestampSource"),
    "events": ("commitTimestamp", "commitTimestampSource"),
    "changes": ("_commit_timestamp",),
    "lib.snapshot": ("timestamp",),
    "lib.history": ("timestamp", "source"),
    "lib.changes": ("_commit_timestamp",),
}


def expectation_of(case: Case, command: str) -> str | None:
    return case.expect.get(command.removeprefix("lib."))


# --- normalising and comparing outputs --------------------------------------------------------


def _iso_ms(text: str) -> int:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def _strict_json_problem(stdout: bytes) -> str | None:
    """Why a JSON-lines output is not strict JSON (NaN/Infinity, bad UTF-8, lone surrogates)."""
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"output is not UTF-8: {exc}"
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_no_constant)
        except ValueError as exc:
            return f"output line {n} is not strict JSON: {str(exc)[:80]}"
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return f"output line {n} holds a lone surrogate"
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@dataclass
class Normaliser:
    """Turns an output into a comparable form: paths of this case replaced, JSON lines parsed."""

    replacements: list[tuple[str, str]]

    def text(self, data: bytes | str) -> str:
        text = data.decode("utf-8", "backslashreplace") if isinstance(data, bytes) else data
        for old, new in self.replacements:
            text = text.replace(old, new)
        return text

    def objects(
        self, command: str, data: bytes, *, drop_time: bool = False, ignore: tuple[str, ...] = ()
    ) -> list[Any]:
        objs = []
        for line in self.text(data).splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = line
            if drop_time and isinstance(obj, dict):
                for k in TIME_FIELDS.get(command, ()):
                    obj.pop(k, None)
            if ignore and isinstance(obj, dict) and command.endswith("snapshot"):
                for k in ignore:
                    obj.pop(k, None)
            objs.append(obj)
        return objs

    def canonical(
        self, command: str, data: bytes, *, drop_time: bool = False, ignore: tuple[str, ...] = ()
    ) -> list[str]:
        items = [dump_json(o) for o in self.objects(command, data, drop_time=drop_time, ignore=ignore)]
        if command in ORDERED:
            return items
        if command.endswith("snapshot") and items:  # header first, then the files in any order
            return items[:1] + sorted(items[1:])
        return sorted(items)


def normaliser_for(case_dir: Path, root: Path, table_arg: str) -> Normaliser:
    forms = {str(root), os.path.realpath(root), f"file://{root}"}
    if table_arg.startswith("/"):
        forms |= {table_arg.rstrip("/"), f"file://{table_arg.rstrip('/')}"}
    elif table_arg.startswith("file:"):
        forms.add(table_arg.rstrip("/"))
    else:
        forms.add(str((case_dir / table_arg).resolve()))
    reps = sorted(((f, "<ROOT>") for f in forms if f), key=lambda r: -len(r[0]))
    return Normaliser([*reps, (str(case_dir), "<CASE>")])


# --- one case ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    case: Case
    command: str
    expected: str
    result: Result
    category: str  # an OK category or the first failure
    failures: list[str]  # "<category>: <why>"


def table_arg_for(case: Case, env: Env) -> str:
    root, table = env.root, env.table
    form = case.table_arg
    if form is None:
        return str(root)
    if form == "symlink":
        link = env.case_dir / "table-link"
        if not link.exists():
            link.symlink_to(root, target_is_directory=True)
        return str(link)
    return {
        "relative": table,
        "dot-relative": f"./{table}",
        "file-uri": f"file://{root}",
        "trailing-slash": f"{root}/",
        "dot-segments": f"{env.case_dir}/./{table}/../{table}",
        "userinfo": f"file://mirror:{case.secret}@localhost{root}",
    }[form]


def cli_argv(command: str, table_arg: str, options: dict[str, str], cdf_start: int | None) -> list[str]:
    if command.startswith("lib."):
        return []
    argv = {
        "snapshot": ["snapshot", table_arg],
        "read": ["read", table_arg],
        "history": ["history", table_arg, "--format", "jsonl"],
        "changes": ["changes", table_arg, "--starting-version", str(cdf_start)],
        "events": ["events", table_arg],
    }[command]
    for k, v in options.items():
        argv += ["-S", f"{k}={v}"]
    return argv


class Runner:
    """Runs cases one after another (one process, no parallelism), with per-table baselines."""

    def __init__(self, workdir: Path, timeout_s: float = 60.0) -> None:
        self.workdir = workdir
        self.timeout_s = timeout_s
        self._baselines: dict[str, dict[str, Result]] = {}
        self._base_norm: dict[str, Normaliser] = {}
        #: table -> command -> why its unmutated run failed (those commands are not judged)
        self.baseline_failures: dict[str, dict[str, str]] = defaultdict(dict)
        self._n = 0

    def commands_for(self, table: str) -> list[str]:
        has_cdf = ml.facts(table).has_cdf
        return [c for c in (*CLI_COMMANDS, *LIB_COMMANDS) if has_cdf or not c.endswith("changes")]

    def baseline(self, table: str, cleaned: bool = False) -> dict[str, Result]:
        """The unmutated table's results (a copy with the same normalised file times)."""
        key = f"{table}{' (cleaned)' if cleaned else ''}"
        if key not in self._baselines:
            base_dir = self.workdir / f"base-{table}{'-cleaned' if cleaned else ''}"
            shutil.rmtree(base_dir, ignore_errors=True)
            base_dir.mkdir(parents=True)
            root = ml.copy_table(table, base_dir, cleaned)
            start = ml.facts(table).changes_start(cleaned)
            results = {}
            for c in self.commands_for(table):
                argv = cli_argv(c, str(root), {}, start)
                r = run_command(c, argv, str(root), {}, start, base_dir, self.timeout_s)
                results[c] = r
                if r.exit != 0:
                    why = r.error or (r.stderr.strip().splitlines() or [f"exit {r.exit}"])[-1]
                    self.baseline_failures[key][c] = f"exit {r.exit}: {why[:200]}"
            self._baselines[key] = results
            self._base_norm[key] = normaliser_for(base_dir, root, str(root))
        return self._baselines[key]

    def base_normaliser(self, case: Case) -> Normaliser:
        self.baseline(case.table, case.cleaned)
        return self._base_norm[f"{case.table}{' (cleaned)' if case.cleaned else ''}"]

    def prepare(self, case: Case) -> tuple[Env, str]:
        self._n += 1
        case_dir = self.workdir / f"case-{self._n:05d}"
        shutil.rmtree(case_dir, ignore_errors=True)
        case_dir.mkdir(parents=True)
        root = ml.copy_table(case.table, case_dir, case.cleaned)
        env = Env(case_dir, root, case.table, canary=f"CANARY-{self._n:05d}-d3lt4m1rr0r")
        env.plant("canary-generic.txt", f"root:x:0:0:{env.canary}\n".encode())
        env.plant("other-bucket/x.parquet", env.canary.encode())
        env.plant(f"{case.table}2/x.parquet", env.canary.encode())
        case.apply(root, env)
        return env, table_arg_for(case, env)

    def run_case(self, case: Case, keep: bool = False) -> list[Outcome]:
        base = self.baseline(case.table, case.cleaned)
        base_norm = self.base_normaliser(case)
        env, table_arg = self.prepare(case)
        norm = normaliser_for(env.case_dir, env.root, table_arg)
        watched = [
            env.case_dir,
            *[p for p in env.case_dir.rglob("*") if not p.is_relative_to(env.root) and not p.is_symlink()],
        ]
        watch = OpenWatch(watched)
        start = ml.facts(case.table).changes_start(case.cleaned)
        outcomes = []
        try:
            for command in self.commands_for(case.table):
                expected = expectation_of(case, command)
                if expected is None or base[command].exit != 0:
                    continue
                b = base[command]
                argv = cli_argv(command, table_arg, case.options, start)
                watch.drain()
                r = run_command(command, argv, table_arg, case.options, start, env.case_dir, self.timeout_s)
                r.opened_outside = watch.drain()
                outcomes.append(self.classify(case, command, expected, r, b, norm, base_norm, env))
        finally:
            watch.close()
            if not keep:
                shutil.rmtree(env.case_dir, ignore_errors=True)
        if case.expect and "consistent" in case.expect.values():
            self._check_consistency(case, outcomes, norm)
        return outcomes

    # --- classification ---------------------------------------------------------------------

    def classify(
        self,
        case: Case,
        command: str,
        expected: str,
        r: Result,
        b: Result,
        norm: Normaliser,
        base_norm: Normaliser,
        env: Env,
    ) -> Outcome:
        failures: list[str] = []
        lib = command.startswith("lib.")
        message = r.error if lib else r.stderr
        everything = "\n".join([r.stdout.decode("utf-8", "replace"), r.stderr, r.error, r.tb, *r.logs])
        # read outside the root: the operating system saw it, or a canary's bytes came out
        if r.opened_outside:
            failures.append(
                f"read-outside-root: opened {', '.join(norm.text(p) for p in r.opened_outside)[:200]}"
            )
        elif env.canary in everything or "root:x:0:0" in everything:
            failures.append("read-outside-root: a canary's content is in the output")
        if case.secret and case.secret in everything:
            where = [
                n
                for n, t in (
                    ("stdout", r.stdout.decode("utf-8", "replace")),
                    ("stderr", r.stderr),
                    ("error", r.error),
                    ("logs", "\n".join(r.logs)),
                )
                if case.secret in t
            ]
            failures.append(f"secret-printed: in {', '.join(where)}")
        if r.timed_out:
            failures.insert(0, f"timeout: {r.error}")
        elif r.exit is None or r.exit not in (0, 2) or "Traceback (most recent call last)" in r.stderr:
            why = r.error or (r.stderr.strip().splitlines() or ["exit " + str(r.exit)])[-1]
            if r.exit == 1:
                why = f"exit 1 (retryable) for bad input: {why}"
            failures.insert(0, f"traceback: {why[:300]}")
        elif r.exit == 2:
            lines = [x for x in message.splitlines() if x.strip()]
            if expected in ("unchanged", "faithful", "accepted", "consistent"):
                failures.insert(0, f"over-refused: {' '.join(lines)[:300]}")
            elif len(lines) != 1:
                failures.insert(0, f"bad-refusal: {len(lines)} lines: {' | '.join(lines)[:300]}")
            elif expected == "refused":
                missing = self._unnamed(case, lines[0])
                if missing:
                    failures.insert(0, f"bad-refusal: does not name {missing}: {lines[0][:300]}")
        else:  # exit 0
            problem = None if lib else _strict_json_problem(r.stdout)
            if problem:
                failures.insert(0, f"wrong-output: {problem}")
            if expected == "refused":
                failures.insert(0, "wrong-output: exit 0 where a refusal is due")
            elif expected == "unchanged" and b.exit == 0:
                got = norm.canonical(command, r.stdout, ignore=case.ignore_fields)
                want = base_norm.canonical(command, b.stdout, ignore=case.ignore_fields)
                if got != want:
                    failures.insert(0, f"wrong-output: differs from the unmutated table: {_diff(want, got)}")
            elif expected == "faithful" and case.marker and not _carries(norm.text(r.stdout), case.marker):
                failures.insert(0, f"wrong-output: the mutated value {case.marker!r} is not in the output")
        category = failures[0].split(":", 1)[0] if failures else expected
        return Outcome(case, command, expected, r, category, failures)

    @staticmethod
    def _unnamed(case: Case, message: str) -> str | None:
        if case.file and case.file not in message:
            return f"file {case.file}"
        if case.line is not None and not re.search(rf"line\D{{0,3}}{case.line}\b", message):
            return f"line {case.line}"
        if case.field_name and case.field_name not in message:
            return f"field {case.field_name!r}"
        if case.names_any and not any(n in message for n in case.names_any):
            return f"any of {list(case.names_any)}"
        return None

    def _check_consistency(self, case: Case, outcomes: list[Outcome], norm: Normaliser) -> None:
        """For file-time classes: one timestamp per version across commands, rows unchanged."""
        by = {o.command: o for o in outcomes if o.result.exit == 0}
        base = self.baseline(case.table, case.cleaned)
        base_norm = self.base_normaliser(case)
        for command, o in by.items():
            if o.failures:
                continue
            b = base[command]
            ig = case.ignore_fields
            got = norm.canonical(command, o.result.stdout, drop_time=True, ignore=ig)
            if b.exit == 0 and got != base_norm.canonical(command, b.stdout, drop_time=True, ignore=ig):
                o.failures.append("wrong-output: differs beyond timestamps from the unmutated table")
        hist = by.get("history")
        if hist is None:
            return
        times = {
            h["version"]: _iso_ms(h["timestamp"])
            for h in norm.objects("history", hist.result.stdout)
            if isinstance(h, dict)
        }
        ordered = [times[v] for v in sorted(times)]
        if any(b <= a for a, b in itertools.pairwise(ordered)):
            hist.failures.append(f"wrong-output: history timestamps not strictly increasing: {ordered}")
        snap = by.get("snapshot")
        if snap is not None:
            header = norm.objects("snapshot", snap.result.stdout)[0]
            if isinstance(header, dict) and times.get(header.get("version")) != _iso_ms(header["timestamp"]):
                snap.failures.append(
                    f"wrong-output: snapshot says {header['timestamp']} for version {header['version']}, "
                    f"history {times.get(header.get('version'))}"
                )
        ev = by.get("events")
        if ev is not None:
            for e in norm.objects("events", ev.result.stdout):
                if isinstance(e, dict) and times.get(e.get("version")) not in (
                    None,
                    e.get("commitTimestamp"),
                ):
                    ev.failures.append(
                        f"wrong-output: events say {e.get('commitTimestamp')} for version {e.get('version')}, "
                        f"history {times.get(e.get('version'))}"
                    )
                    break
        for o in by.values():
            if o.failures:
                o.category = o.failures[0].split(":", 1)[0]

    # --- subprocess sample ------------------------------------------------------------------

    def subprocess_mismatches(self, case: Case) -> list[str]:
        """Run the case's CLI commands as real processes and list where they disagree with in-process."""
        inproc = {o.command: o for o in self.run_case(case, keep=True)}
        case_dir = self.workdir / f"case-{self._n:05d}"
        env = Env(case_dir, case_dir / case.table, case.table, canary="")
        table_arg = table_arg_for(case, env)
        norm = normaliser_for(case_dir, env.root, table_arg)
        start = ml.facts(case.table).changes_start(case.cleaned)
        exe = Path(sys.executable).with_name("deltamirror")
        problems = []
        try:
            for command in CLI_COMMANDS:
                o = inproc.get(command)
                if o is None:
                    continue
                argv = [str(exe), *cli_argv(command, table_arg, case.options, start)]
                p = subprocess.run(argv, cwd=case_dir, capture_output=True, timeout=self.timeout_s * 2)
                sub_tb = p.returncode not in (0, 2) or b"Traceback (most recent call last)" in p.stderr
                in_tb = o.category in ("traceback", "timeout")
                if sub_tb != in_tb or (not sub_tb and p.returncode != o.result.exit):
                    problems.append(
                        f"{case.id} {command}: exit {p.returncode} in a process, {o.result.exit} in-process"
                    )
                elif p.returncode == 0 and norm.canonical(command, p.stdout) != norm.canonical(
                    command, o.result.stdout
                ):
                    problems.append(f"{case.id} {command}: stdout differs between a process and in-process")
                elif p.returncode == 2 and norm.text(p.stderr).strip() != norm.text(o.result.stderr).strip():
                    problems.append(
                        f"{case.id} {command}: stderr differs: {norm.text(p.stderr).strip()[:120]!r}"
                    )
        finally:
            shutil.rmtree(case_dir, ignore_errors=True)
        return problems


def _carries(output: str, marker: str) -> bool:
    return re.sub(r"\s", "", marker) in re.sub(r"\s", "", output)


def _diff(want: list[str], got: list[str]) -> str:
    if len(want) != len(got):
        return f"{len(got)} records instead of {len(want)}"
    for w, g in zip(want, got, strict=True):
        if w != g:
            return f"first difference: {g[:120]!r} instead of {w[:120]!r}"
    return "?"
