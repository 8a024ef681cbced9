"""Mutation testing on the modules that carry the worker's guarantees (issue 55).

With cosmic-ray: each mutant (an operator changed, a constant moved, a condition negated) is
applied to the source on disk, the module's own tests run in a fresh process, and the mutant
is killed (a test failed), survived (every test passed: a guarantee no test holds), or
incompetent (it broke the import).

    python mutation/run.py                                # every module below (hours)
    python mutation/run.py worker/formats/json.py         # one module, in the edit loop
    python mutation/run.py worker/formats/json.py --report  # the last run's results only
    python mutation/run.py worker/io/kafka.py --sample 40   # a seeded random 40 of its mutants
    python mutation/run.py worker/io/kafka.py --rerun-survivors  # after tests were added
    python mutation/run.py worker/io/kafka.py --fresh --sample 40 --seed 56  # a new sample

A module has from 300 to 2,500 mutants and each costs 7-50 s of tests, so a whole run takes
hours a module; ``--sample N`` draws N of the module's mutants at random (seeded: the same N
every time), the rest marked not sampled, and the score is then an estimate from those N
(its 95% Wilson interval beside it: with 40 mutants about +-15 points, so compare
intervals, not the scores alone). ``--rerun-survivors`` runs the survivors again against the
tests as they are now: it shows the tests kill what they were written for, but those
mutants are no longer a random draw. ``--fresh --sample N --seed S`` (S another seed than
the last) keeps the module's first score as "before", once, and draws a new sample from the
module as it now stands: the unbiased "after" (a changed module has other mutants, so an
old session cannot be run again anyway).
Two modules can run at once (two processes): each has its own copy of the checkout.

The mutants are written into a copy of the checkout (out/mutation/tree/<module>, refreshed
from the files as they stand at each run), never into the files being edited. Sessions are
kept in out/mutation/<module>.sqlite: a run stopped part way goes on where it stopped. To
start a module over, delete its session and its entry in mutation/results.json.
The results of every module (the committed mutation/results.json, from which
mutation/RESULTS.md is written) are kept across runs and checkouts.
Each module's results go to mutation/RESULTS.md: the score, and every surviving mutant with
its place and change. A survivor is then killed by a new test or, when no input can tell it
apart from the original (an equivalent mutant), listed in mutation/EQUIVALENT.md with why;
a line no mutation can matter for carries ``# pragma: no mutate`` (cr-filter-pragma).

Why cosmic-ray (measured on worker/formats/json.py, 2026-12-06): mutmut 3.8.1 runs the
tests inside one process behind trampolines; it mapped 49 of the first 61 mutants to "no
tests" (the format classes are reached through input_format, which its per-function map
does not follow) and the rest timed out. cosmic-ray applies each mutant to the file and runs
the module's test files as given, so the compiled extensions and the fixtures behave as in
`make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "mutation"
RESULTS = ROOT / "mutation" / "RESULTS.md"
STATE = ROOT / "mutation" / "results.json"  # every module's last results (and "before")

# module -> the tests that hold its guarantees (run per mutant, stopping at the first failure)
MODULES = {
    # (less test_json's two tests that start the worker in a child process: the same code)
    "worker/formats/json.py": ["tests/test_json.py", "tests/test_format_bounds.py",
                               "tests/test_catboost_categorical.py", "-k",
                               "'not replay_expect and not worker_reads_json'"],
    "worker/formats/avro.py": ["tests/test_avro.py", "tests/test_input_contract.py"],
    "worker/formats/base.py": ["tests/test_input_contract.py", "tests/test_json.py",
                               "tests/test_avro.py"],
    "worker/codec.py": ["tests/test_hostile_input.py", "tests/test_native_ipc.py",
                        "tests/test_batches.py"],
    "worker/serve/oip.py": ["tests/test_serve.py"],
    "worker/io/kafka.py": ["tests/test_rebalance.py", "tests/test_hostile_runs.py",
                           "tests/test_kafka_errors.py"],
    "worker/config.py": ["tests/test_cli_config.py", "tests/test_config_guards.py",
                         "tests/test_security_config.py", "tests/test_config_bounds.py",
                         "tests/test_docs.py"],
    "worker/model/onnx_loader.py": ["tests/test_onnx.py", "tests/test_onnx5.py"],
}


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def _config(module: str, tests: list[str], timeout: float) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    cfg = OUT / f"{_stem(module)}.toml"
    cmd = (f"{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly "
           + " ".join(tests))
    cfg.write_text(f"""[cosmic-ray]
module-path = "{module}"
timeout = {timeout}
excluded-modules = []
test-command = "{cmd}"

[cosmic-ray.distributor]
name = "local"
""")
    return cfg


def _stem(module: str) -> str:
    return module.replace("/", "_").removesuffix(".py")


def _copy_tree(module: str) -> Path:
    """The checkout as it stands (tracked and new files, and the built extensions) copied to
    out/mutation/tree/<module>: cosmic-ray writes each mutant into the file on disk, so it
    works on this copy, never on the files being edited (or committed) meanwhile."""
    tree = OUT / "tree" / _stem(module)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    built = [p.relative_to(ROOT) for p in (ROOT / "worker").glob("*.so")]
    for rel in [Path(f.decode()) for f in files if f] + built:
        src, dst = ROOT / rel, tree / rel
        if not src.is_file():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            shutil.copy2(src, dst)
    return tree


def _annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the module's annotations are ((line, col) start and end), if the module has
    ``from __future__ import annotations``: never evaluated, a mutant there is equivalent."""
    import ast

    tree = ast.parse(path.read_text())
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
               any(a.name == "annotations" for a in n.names) for n in tree.body):
        return []
    spans = []
    for node in ast.walk(tree):
        ann = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            ann.append(node.returns)
        elif isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation:
            ann.append(node.annotation)
        spans += [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in ann]
    return spans


def _skip_annotations(session: Path, module: str) -> int:
    """Mark the pending mutants inside annotations skipped (equivalent: see above)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans = _annotation_spans(ROOT / module)
    skipped = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            m = item.mutations[0]
            at = tuple(m.start_pos)
            if any(a <= at < b for a, b in spans):
                db.set_result(item.job_id, WorkResult(
                    worker_outcome=WorkerOutcome.SKIPPED,
                    output="inside an annotation (from __future__ import annotations: "
                           "never evaluated): equivalent"))
                skipped += 1
    return skipped


NOT_SAMPLED = "not in the sample"


def _sample(session: Path, n: int, seed: int) -> int:
    """Keep a seeded random n of the pending mutants; mark the others not sampled."""
    import random

    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        if any((r.output or "").startswith(NOT_SAMPLED) for _, r in db.results):
            return 0  # sampled before: the same sample goes on
        pending = sorted(db.pending_work_items, key=lambda w: w.job_id)
        keep = set(w.job_id for w in random.Random(seed).sample(pending, min(n, len(pending))))
        out = [w.job_id for w in pending if w.job_id not in keep]
        db.set_multiple_results(out, WorkResult(
            worker_outcome=WorkerOutcome.SKIPPED,
            output=f"{NOT_SAMPLED} (--sample {n} --seed {seed})"))
    return len(out)


def _rerun_survivors(session: Path, module: str) -> int:
    """Keep the score as it stands as the module's "before", then make its survivors
    pending again (their results deleted), to be run against the tests as they are now."""
    import sqlite3

    state = STATE
    known = json.loads(state.read_text()) if state.exists() else {}
    if "before" not in known.get(module, {}):
        r = results(module)  # (a rerun's "before": the score as it stood)
        known.setdefault(module, {})["before"] = {
            k: r[k] for k in ("killed", "survived", "score")}
        known[module]["before"]["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        state.write_text(json.dumps(known, indent=1))
    with sqlite3.connect(session) as db:
        n = db.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'").rowcount
    return n


def _fresh(session: Path, module: str, seed: int) -> None:
    """Keep the session's score as the module's "before" (and its file beside it), so that
    a new one is drawn."""
    if not session.exists():
        return
    r = results(module)
    state = STATE
    known = json.loads(state.read_text()) if state.exists() else {}
    entry = known.setdefault(module, {})
    if "before" in entry:  # the first sample stays "before"
        session.rename(session.with_suffix(f".{time.strftime('%Y%m%d%H%M%S')}.sqlite"))
        return
    entry["before"] = {k: r[k] for k in ("killed", "survived", "score", "interval",
                                         "survivors")}
    entry["before"]["when"] = entry.get("when", time.strftime("%Y-%m-%d %H:%M UTC",
                                                              time.gmtime()))
    state.write_text(json.dumps(known, indent=1))
    session.rename(session.with_suffix(".before.sqlite"))
    print(f"{module}: the last run kept as before ({r['score']}%); a new sample, seed {seed}",
          file=sys.stderr)


def run(module: str, timeout: float, sample: int | None = None, seed: int = 55,
        rerun: bool = False, fresh: bool = False) -> Path:
    tests = MODULES[module]
    cfg = _config(module, tests, timeout)
    session = cfg.with_suffix(".sqlite")
    if fresh:
        _fresh(session, module, seed)
    tree = _copy_tree(module)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not session.exists():
        subprocess.run([_tool("cosmic-ray"), "init", str(cfg), str(session)], cwd=tree,
                       check=True, env=env)
        subprocess.run([_tool("cr-filter-pragma"), str(session)], cwd=tree, check=True,
                       env=env)
    print(f"{module}: {_skip_annotations(session, module)} mutants in annotations skipped",
          file=sys.stderr)
    if sample is not None:
        print(f"{module}: {_sample(session, sample, seed)} mutants not sampled",
              file=sys.stderr)
    if rerun:
        print(f"{module}: {_rerun_survivors(session, module)} survivors to run again",
              file=sys.stderr)
    t0 = time.monotonic()
    subprocess.run([_tool("cosmic-ray"), "exec", str(cfg), str(session)], cwd=tree,
                   check=True, env=env)
    print(f"{module}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return session


def results(module: str) -> dict:
    """The session's jobs: counts by outcome, and the survivors with their place."""
    session = OUT / f"{_stem(module)}.sqlite"
    if not session.exists():
        raise SystemExit(f"{module}: no session ({session}): run it first")
    dump = subprocess.run([_tool("cosmic-ray"), "dump", str(session)], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    counts = {"killed": 0, "survived": 0, "incompetent": 0, "pending": 0, "skipped": 0,
              "not_sampled": 0}
    survivors = []
    for line in dump.splitlines():
        job, result = json.loads(line)
        if result is None:
            counts["pending"] += 1
            continue
        outcome = (result.get("test_outcome") or "").lower()
        if (result.get("output") or "").startswith(NOT_SAMPLED):
            counts["not_sampled"] += 1
        elif result.get("worker_outcome", "").lower() == "skipped":
            counts["skipped"] += 1
        elif outcome in counts:
            counts[outcome] += 1
        if outcome == "survived":
            for m in job["mutations"]:
                survivors.append({"line": m["start_pos"][0], "operator": m["operator_name"],
                                  "occurrence": m["occurrence"], "job": job["job_id"],
                                  "diff": (result.get("diff") or "").strip()})
    done = counts["killed"] + counts["survived"]
    counts["score"] = round(100.0 * counts["killed"] / done, 1) if done else None
    counts["interval"] = _wilson(counts["killed"], done) if counts["not_sampled"] else None
    return {"module": module, "tests": MODULES[module], **counts,
            "survivors": sorted(survivors, key=lambda s: s["line"])}


def _wilson(k: int, n: int) -> list[float] | None:
    """The 95% Wilson interval of a score k of n drawn at random (in %)."""
    if not n:
        return None
    z, p = 1.96, k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return [round(100 * (mid - half), 1), round(100 * (mid + half), 1)]


def write_results(rows: list[dict], ran: bool = True) -> None:
    """mutation/RESULTS.md: every module run so far (kept), this run's replacing its own
    (two runs at once take turns: a lock on the state file)."""
    import fcntl

    state = STATE
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = json.loads(state.read_text()) if state.exists() else {}
        for r in rows:
            before = known.get(r["module"], {}).get("before")
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()) if ran else \
                known.get(r["module"], {}).get("when", "-")  # --report: when it ran
            known[r["module"]] = {**r, "when": when}
            if before:
                known[r["module"]]["before"] = before
        state.write_text(json.dumps(known, indent=1))
        _write_md(known)


def _write_md(known: dict) -> None:
    lines = ["# Mutation testing results", "",
             "`python mutation/run.py MODULE` (`make mutate`, `make mutate MODULE=...`): "
             "cosmic-ray 8.7.0, each mutant against the module's tests (`mutation/run.py` "
             "MODULES). Score: killed / (killed + survived). Survivors are listed with their "
             "line and change (lines of the module as it stood for that run); each is killed "
             "by a test or explained in `mutation/EQUIVALENT.md`. Where a module was sampled "
             "(`--sample N`), the score is an estimate from the N drawn at random, its 95% "
             "Wilson interval beside it (about +-15 points for 40: compare intervals). "
             "Mutants: all of the module's; sampled: those drawn; skipped: drawn but inside "
             "annotations or under `# pragma: no mutate` (never run). Before: the first "
             "sample, whose survivors were then each killed by a test or explained in "
             "EQUIVALENT.md; after: a new sample (`--fresh`, another seed) from the module as "
             "it now stands, against the tests as they now stand.", "",
             "| module | tests | mutants | sampled | skipped | killed | survived | "
             "incompetent | pending | score before (95%) | score after (95%) | written |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    known = {m: r for m, r in known.items() if "tests" in r}  # (a "before" alone: running)
    for r in known.values():
        total = sum(r.get(k, 0) for k in ("killed", "survived", "incompetent", "pending",
                                           "skipped", "not_sampled"))
        tests = ", ".join(Path(t).name for t in r["tests"] if t.startswith("tests/"))
        before = r.get("before")
        was = "-"
        if before:
            was = f"{before['score']}%"
            if before.get("interval"):
                was += f" ({before['interval'][0]}-{before['interval'][1]}%)"
            was += f", {before['survived']} survived"
        now = f"{r['score']}%" if r["score"] is not None else "-"
        if r.get("interval"):
            now += f" ({r['interval'][0]}-{r['interval'][1]}%)"
        lines.append(f"| {r['module']} | {tests} | {total} | "
                     f"{total - r.get('not_sampled', 0)} | {r.get('skipped', 0)} | "
                     f"{r['killed']} | {r['survived']} | {r['incompetent']} | "
                     f"{r['pending']} | {was} | {now} | {r['when']} |")
    for r in known.values():
        for title, survivors in (
                (f"Survivors in {r['module']}", r["survivors"]),
                (f"Survivors in {r['module']}, before (see EQUIVALENT.md for each)",
                 (r.get("before") or {}).get("survivors") or [])):
            if not survivors:
                continue
            lines += ["", f"## {title}", ""]
            for s in survivors:
                first = next((ln for ln in s["diff"].splitlines() if ln.startswith("+")
                              and not ln.startswith("+++")), "").strip()
                lines.append(f"- line {s['line']}, {s['operator']}: `{first[:120]}`")
    RESULTS.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    ap.add_argument("--report", action="store_true", help="write the results of the last run")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds a mutant's tests may take (then: killed, by timeout)")
    ap.add_argument("--sample", type=int, help="run a seeded random N of the mutants only")
    ap.add_argument("--seed", type=int, default=55, help="the sample's seed (55)")
    ap.add_argument("--fresh", action="store_true",
                    help="keep the score as 'before', draw a new sample (another --seed)")
    ap.add_argument("--rerun-survivors", action="store_true",
                    help="keep the score as 'before', run the survivors again")
    args = ap.parse_args()
    if args.fresh and args.sample is None:
        ap.error("--fresh draws a new sample: give --sample N (and another --seed)")
    modules = args.modules or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        raise SystemExit(f"not in mutation/run.py MODULES: {', '.join(unknown)}")
    rows = []
    for module in modules:
        if not args.report:
            run(module, args.timeout, args.sample, args.seed, args.rerun_survivors,
                args.fresh)
        rows.append(results(module))
    write_results(rows, ran=not args.report)
    print(RESULTS.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
