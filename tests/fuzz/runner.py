"""Fuzz driver: a child process runs Hypothesis over hostile cases; this parent watches it.

The child writes each case to ``current.bin`` before running it and counts finished cases in
``count``. A child that dies by a signal (a crash in native code) or stops making progress (a
hang) leaves its case behind: the parent saves it under ``crashes/`` or ``hangs/`` and starts
a new child with another seed until the number of cases asked for has run. An invariant that
fails in Python is reported by Hypothesis (shrunk) and saved under ``failures/``.

    python -m tests.fuzz messages --cases 100000 --state out/fuzz   # make fuzz
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_MODEL = ROOT / "tests" / "golden" / "fraud-xgb.model"


@dataclass
class Report:
    kind: str
    cases: int = 0
    children: int = 0
    outcomes: Counter = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)  # saved case files
    hangs: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.crashes or self.hangs or self.failures)

    def summary(self) -> str:
        return (f"{self.kind}: {self.cases} cases in {self.children} child process(es), "
                f"crashes {len(self.crashes)}, hangs {len(self.hangs)}, invariant failures "
                f"{len(self.failures)}; outcomes {dict(self.outcomes.most_common())}"
                + "".join(f"\n  crash: {c}" for c in self.crashes)
                + "".join(f"\n  hang: {c}" for c in self.hangs)
                + "".join(f"\n  failure: {c}" for c in self.failures))


def run(kind: str, cases: int, state: Path, seed: int = 0, hang_s: float = 30.0,
        max_children: int = 50) -> Report:
    """Run ``cases`` cases of ``kind`` ('messages' or 'artifacts') in child processes."""
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True)
    rep = Report(kind)
    env = {**os.environ, "PYTHONFAULTHANDLER": "0"}
    while rep.cases < cases and rep.children < max_children:
        child_dir = state / f"child-{rep.children}"
        shutil.rmtree(child_dir, ignore_errors=True)
        child_dir.mkdir()
        cmd = [sys.executable, "-m", "tests.fuzz", "child", kind, "--cases",
               str(cases - rep.cases), "--seed", str(seed + 7919 * rep.children),
               "--state", str(child_dir)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        rep.children += 1
        hung = False
        last, last_t = -1, time.monotonic()
        while proc.poll() is None:
            time.sleep(0.2)
            n = _count(child_dir)
            if n != last:
                last, last_t = n, time.monotonic()
            elif time.monotonic() - last_t > hang_s:
                hung = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out = proc.stdout.read().decode(errors="replace")
        proc.stdout.close()
        done = max(_count(child_dir), 0)
        rep.cases += done
        res = child_dir / "result.json"
        if res.exists():
            rep.outcomes.update(json.loads(res.read_text())["outcomes"])
        if hung or proc.returncode < 0:
            rep.cases += 1  # the case that crashed or hung
            where = "hangs" if hung else "crashes"
            saved = _save(child_dir, state / where, rep.children,
                          f"signal {-proc.returncode}" if not hung else f"no progress {hang_s} s")
            (rep.hangs if hung else rep.crashes).append(saved)
        elif proc.returncode != 0:
            saved = state / "failures" / f"failure-{rep.children}.txt"
            saved.parent.mkdir(exist_ok=True)
            saved.write_text(out)
            rep.failures.append(f"{saved}: {out.strip().splitlines()[-1] if out.strip() else ''}")
            if done == 0:
                break
        if done == 0 and not (hung or proc.returncode < 0):
            break
    return rep


def _count(d: Path) -> int:
    try:
        return int((d / "count").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _save(child_dir: Path, dest: Path, k: int, why: str) -> str:
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"case-{k}.bin"
    src = child_dir / "current.bin"
    if src.exists():
        shutil.copyfile(src, target)
    what = (child_dir / "current.txt").read_text() if (child_dir / "current.txt").exists() \
        else ""
    (dest / f"case-{k}.txt").write_text(f"{why}: {what}\n")
    return f"{target} ({why}: {what})"


class Case:
    """The child's side: record the case before running it, count it after."""

    def __init__(self, state: Path):
        self.state = Path(state)
        self.n = 0
        self.outcomes: Counter = Counter()

    def begin(self, data: bytes, what: str) -> None:
        (self.state / "current.bin").write_bytes(data)
        (self.state / "current.txt").write_text(what)

    def end(self, outcome: str) -> None:
        self.n += 1
        self.outcomes[outcome] += 1
        (self.state / "count").write_text(str(self.n))

    def finish(self) -> None:
        (self.state / "result.json").write_text(json.dumps({"outcomes": self.outcomes}))
