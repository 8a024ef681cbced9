"""The measurements: answer check, batch throughput, single-row latency, memory footprint."""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import time

import numpy as np

TOL = 1e-5  # the fidelity guarantee (README): predict_proba within 1e-5 of the source library


def check_answers(engines, ref_engine, X) -> dict[str, float]:
    """Max |p - p_ref| of every engine against the model's own library; raise past TOL."""
    ref = ref_engine.proba(X)
    errs = {}
    for e in engines:
        errs[e.name] = float(np.max(np.abs(e.proba(X) - ref)))
    bad = {k: v for k, v in errs.items() if not v <= TOL}
    if bad:
        raise AssertionError(f"{ref_engine.bm.key}: engines disagree with "
                             f"{ref_engine.name}: {bad}")
    return errs


def throughput(engine, X, threads: int, repeats: int, budget_s: float) -> dict:
    """Median rows/s of `repeats` timed calls on the whole batch (one warm-up call first)."""
    engine.set_threads(threads)
    engine.batch(X)
    times = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.batch(X)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    engine.set_threads(1)
    med = statistics.median(times)
    return {"rows_per_s": X.shape[0] / med, "median_s": med, "repeats": len(times),
            "spread": (max(times) - min(times)) / med}


def scaling_times(engine, X, repeats: int) -> dict[str, list[float]]:
    """Seconds of `repeats` calls at 1 and at 2 threads, the two counts alternated (one
    warm-up each first), so a neighbour's burst on this shared host falls on both alike."""
    times: dict[str, list[float]] = {"1": [], "2": []}
    for k in (1, 2):
        engine.set_threads(k)
        engine.batch(X)
    for _ in range(repeats):
        for k in (1, 2):
            engine.set_threads(k)
            t0 = time.perf_counter()
            engine.batch(X)
            times[str(k)].append(time.perf_counter() - t0)
    engine.set_threads(1)
    return times


def percentiles(ns: np.ndarray) -> dict:
    us = ns.astype(np.float64) / 1e3
    return {"n": int(us.size), "p50": float(np.percentile(us, 50)),
            "p99": float(np.percentile(us, 99)), "p99.9": float(np.percentile(us, 99.9)),
            "max": float(us.max()), "mean": float(us.mean())}


def latency_python(engine, rows: np.ndarray, n_calls: int, budget_s: float) -> dict:
    """Per-call wall time of engine.one(row) from Python, row = a (1, n_features) view."""
    engine.set_threads(1)
    views = [rows[i:i + 1] for i in range(rows.shape[0])]
    for v in views[:50]:  # warm-up
        engine.one(v)
    t0 = time.perf_counter_ns()
    engine.one(views[0])
    est = max(time.perf_counter_ns() - t0, 1)
    n = int(min(n_calls, max(1000, budget_s * 1e9 / est)))
    ns = np.empty(n, dtype=np.int64)
    one, clock, nv = engine.one, time.perf_counter_ns, len(views)
    gc.disable()
    try:
        for i in range(n):
            v = views[i % nv]
            t0 = clock()
            one(v)
            ns[i] = clock() - t0
    finally:
        gc.enable()
    return percentiles(ns)


def latency_native(model, rows: np.ndarray, n_calls: int, rounds: int = 5) -> dict | None:
    """Per-call time of one row's full evaluation inside C (clock_gettime around each call)."""
    from worker import _timing

    fn = getattr(_timing, "bench_row_latency", None)
    if fn is None:
        return None
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    fn(model.forest, rows, 1000)  # warm-up
    # rounds of n_calls each; every percentile is the median over rounds (another process
    # waking on one of the two cores can otherwise own the whole tail of a single round)
    runs = [percentiles(np.asarray(fn(model.forest, rows, n_calls))) for _ in range(rounds)]
    out = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    out["n"] = n_calls
    out["rounds"] = rounds
    return out


_FOOTPRINT = """
import gc, sys
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096
{imports}
import numpy as np
X = np.load({x!r})
gc.collect(); r0 = rss()
{load}
run(X); run(X[:1])
gc.collect(); r1 = rss()
print(r1 - r0)
"""


def footprint(engine, x_path: str) -> int | None:
    """RSS growth of a fresh process that loads the model and scores 1000 rows with it
    (libraries imported before the first reading, so only the model and its buffers count)."""
    snippet = engine.load_snippet
    imports = snippet.splitlines()[0]
    code = _FOOTPRINT.format(imports=imports, x=x_path, load=snippet)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300, check=True, env=_env())
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        print(f"  footprint {engine.name}: failed ({exc})", file=sys.stderr)
        return None


def _env():
    import os

    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def dump(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=float)
