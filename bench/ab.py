"""Two builds compared in alternated processes: the A/B tool every before/after speed figure in
bench/*.md comes from.

Each side is a git revision checked out beside this one with its own extensions built
(bench/worktree.py, under out/ab/), or ``.`` for this checkout as it is (uncommitted changes
included). The command runs ``--runs`` times a side, in ABBA order, each run a fresh process
in that side's tree whose ``import worker`` is that side's (``PYTHONPATH``, and the working
directory, which bench scripts put on ``sys.path`` first); both sides run this checkout's
harness (the command's paths made absolute), so only the package differs. With ``--cpu N``
every run is pinned to that CPU. Alternation puts a slow minute of the machine on both sides
alike.

The command prints its figures, one a line: exactly ``NAME VALUE`` (other lines are ignored),
or JSON objects of ``{"name": value}``; higher is better unless the name ends in ``_s``,
``_us``, ``_ms`` or ``_seconds`` (``_per_s`` is a rate). The report gives each figure's
median, its spread (min-max and the interquartile range in % of the median) on both sides,
and B's median over A's, with the spreads' overlap marked: a ratio inside the noise is called
so.

    .venv/bin/python bench/ab.py --a HEAD~1 --b . --runs 7 -- .venv/bin/python bench/quick.py
    .venv/bin/python bench/ab.py --a ed990e3 --b . --runs 5 --json out/ab.json -- \\
        .venv/bin/python bench/e2e.py --figures
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_LINE = re.compile(r"^([A-Za-z_][\w.:/\[\]-]*)\s+(-?[0-9]+\.?[0-9]*(?:[eE][-+]?[0-9]+)?)$")


def lower_is_better(name: str) -> bool:
    """Times are better lower (``_s``, ``_us``, ``_ms``, ``_seconds``); rates (``_per_s``)
    and everything else higher."""
    return not name.endswith("_per_s") and name.endswith(("_s", "_us", "_ms", "_seconds"))


def figures(text: str) -> dict[str, float]:
    """``NAME VALUE`` lines and JSON objects of numbers in a run's stdout."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            out.update({str(k): float(v) for k, v in obj.items()
                        if isinstance(v, int | float) and not isinstance(v, bool)})
            continue
        m = _LINE.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def tree(rev: str) -> Path:
    if rev == ".":
        return REPO
    sys.path.insert(0, str(REPO / "bench"))
    from worktree import checkout

    safe = re.sub(r"[^\w.-]", "_", rev)
    print(f"ab: building {rev} under out/ab/{safe} (minutes on 2 cores) ...", file=sys.stderr)
    return checkout(rev, REPO / "out" / "ab" / safe)


def localized(cmd: list[str]) -> list[str]:
    """The command with its relative paths that exist in this checkout made absolute: both
    sides run this checkout's harness (the virtualenv's python, the bench script) on their
    own build of the package."""
    return [str(REPO / a) if not Path(a).is_absolute() and (REPO / a).exists() else a
            for a in cmd]


def run_once(where: Path, cmd: list[str], cpu: int | None, timeout: float) -> dict[str, float]:
    # run in the side's tree, its package first on the path: bench scripts put "." on
    # sys.path ahead of PYTHONPATH, so the working directory decides which build is imported
    env = {**os.environ, "PYTHONPATH": str(where)}
    full = (["taskset", "-c", str(cpu)] if cpu is not None else []) + localized(cmd)
    proc = subprocess.run(full, cwd=where, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"ab: the command failed in {where} (exit {proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    got = figures(proc.stdout)
    if not got:
        raise SystemExit(f"ab: the command printed no figures:\n{proc.stdout[-2000:]}")
    return got


def spread(values: list[float]) -> dict:
    med = statistics.median(values)
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [med, med, med]
    return {"median": med, "min": min(values), "max": max(values),
            "iqr_pct": 100 * (q[2] - q[0]) / abs(med) if med else 0.0, "runs": values}


def compare(a: dict[str, list[float]], b: dict[str, list[float]]) -> list[dict]:
    rows = []
    for name in a:
        if name not in b:
            continue
        sa, sb = spread(a[name]), spread(b[name])
        ratio = sb["median"] / sa["median"] if sa["median"] else float("nan")
        lower = lower_is_better(name)
        better = (ratio < 1) if lower else (ratio > 1)
        overlap = sa["min"] <= sb["max"] and sb["min"] <= sa["max"]
        verdict = "within noise" if overlap else ("B better" if better else "B worse")
        rows.append({"figure": name, "a": sa, "b": sb, "b_over_a": ratio,
                     "lower_is_better": lower, "verdict": verdict})
    return rows


def table(rows: list[dict], a: str, b: str) -> str:
    lines = [f"| figure | A ({a}) median [min-max] IQR | B ({b}) median [min-max] IQR | B/A | "
             "verdict |", "|---|---|---|---|---|"]

    def cell(s):
        return f"{s['median']:.6g} [{s['min']:.4g}-{s['max']:.4g}] {s['iqr_pct']:.1f}%"

    for r in rows:
        lines.append(f"| {r['figure']}{' (lower is better)' if r['lower_is_better'] else ''} "
                     f"| {cell(r['a'])} | {cell(r['b'])} | {r['b_over_a']:.3f} | "
                     f"{r['verdict']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", help="revision A (a git ref, or . for this checkout)")
    ap.add_argument("--b", help="revision B (a git ref, or . for this checkout)")
    ap.add_argument("--runs", type=int, default=7, help="runs a side (default 7)")
    ap.add_argument("--cpu", type=int, default=None, help="pin every run to this CPU")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a run")
    ap.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    ap.add_argument("--table", type=Path, default=None,
                    help="print the table of a --json file written before, run nothing")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command a run")
    args = ap.parse_args()
    if args.table:
        saved = json.loads(args.table.read_text())
        runs = {side: {r["figure"]: r[side.lower()]["runs"] for r in saved["figures"]}
                for side in ("A", "B")}
        print(table(compare(runs["A"], runs["B"]), saved["a"], saved["b"]))
        return
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd or not args.a or not args.b:
        ap.error("give --a, --b and the command after --")
    trees = {"A": tree(args.a), "B": tree(args.b)}
    got: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    t0 = time.monotonic()
    for i in range(args.runs):
        for side in ("A", "B") if i % 2 == 0 else ("B", "A"):  # ABBA: drift cancels
            for name, value in run_once(trees[side], cmd, args.cpu, args.timeout).items():
                got[side].setdefault(name, []).append(value)
        print(f"ab: pair {i + 1}/{args.runs} done ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr)
    rows = compare(got["A"], got["B"])
    print(table(rows, args.a, args.b))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"a": args.a, "b": args.b, "cmd": cmd,
                                         "runs": args.runs, "cpu": args.cpu,
                                         "figures": rows}, indent=1))


if __name__ == "__main__":
    main()
