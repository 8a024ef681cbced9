"""Reason codes: attributions against the libraries' own, and what explaining flagged rows costs.

    python bench/explain.py [--quick]        # or: make bench-explain (also run by make bench)

Models A-D of bench/models.py, one thread, rows with 2% missing values (A-C; D's library
refuses NaN: dense rows), all in one run:

1. All contributions (rows/s): ours (`contributions`, treeshap and path) against XGBoost
   `pred_contribs` / `approx_contribs` (A, B) and `shap.TreeExplainer` (path-dependent
   TreeSHAP, and `approximate=True`, its Saabas) for C and D. The largest difference to the
   library's answer is printed beside each figure.
2. Scoring with `explain` (top 3 of the rows at or above a threshold set so that 1% and 10%
   are flagged) against scoring without it, on batches of 10,000 rows (A, D) or 2,000 (B, C,
   whose deep trees take milliseconds a row to explain): the median of rounds that alternate
   the two calls (`paired_cost`).

Writes bench/out/explain/results.json and bench/EXPLAIN-RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))

import numpy as np  # noqa: E402
from lazy import best_time  # noqa: E402 (a warm-up call, then the best of ``repeat``)

OUT = REPO / "bench" / "out" / "explain"


def library_contribs(bm, X: np.ndarray, method: str):
    if bm.library == "xgboost":
        import xgboost as xgb

        bm.source.set_param({"nthread": 1})
        dm = xgb.DMatrix(X)
        return lambda: bm.source.predict(dm, pred_contribs=True,
                                         approx_contribs=method == "path")
    import shap

    ex = shap.TreeExplainer(bm.source, feature_perturbation="tree_path_dependent")
    X64 = X.astype(np.float64)
    return lambda: ex.shap_values(X64, check_additivity=False, approximate=method == "path")


def paired_cost(plain, explained, rounds: int) -> tuple[float, float, list[float]]:
    """What ``explained`` costs over ``plain``: the median of ``rounds`` rounds' own ratios,
    the two calls alternated within each round, so a neighbour's burst on this shared host
    lands on both sides of a ratio rather than on one block of calls (after a warm-up call
    of each). Also the median time of ``explained`` and each round's ratio."""
    plain()
    explained()
    ratios, times = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        plain()
        t1 = time.perf_counter()
        explained()
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
        times.append(t2 - t1)
    return float(np.median(ratios)), float(np.median(times)), ratios


def _as_margin_rows(ref, n_features: int) -> np.ndarray:
    """The library's attributions of the positive class, features only: (rows, features)."""
    ref = np.asarray(ref)
    if ref.ndim == 3:  # shap: (rows, features, classes)
        ref = ref[:, :, -1]
    return ref[:, :n_features]


def run(quick: bool) -> dict:
    import models as bench_models

    res = {"machine": {"cpu": _cpu(), "cpus": _cpus(), "python": platform.python_version(),
                       "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())},
           "models": {}}
    n_all = {"A": 4000, "B": 500, "C": 50, "D": 4000}  # C: ~0.1 s a row (deep trees)
    if quick:
        n_all = {k: max(v // 10, 50) for k, v in n_all.items()}
    for key in ("A", "B", "C", "D"):
        res["models"][key] = one_model(key, bench_models.load(key), n_all[key])
    return res


def one_model(key: str, bm, n: int) -> dict:
    import models as bench_models

    import worker

    model = worker.compile_model(bm.source)
    batch = 10_000 if key in ("A", "D") else 2_000  # B and C: deep trees, slow attributions
    X, _ = bench_models.data(max(n, batch), seed=7)
    if key != "D":
        X = bench_models.with_missing(X, seed=8)
    Xc = np.ascontiguousarray(X[:n])
    row = {"title": bm.title, "rows": int(Xc.shape[0])}
    for method in ("treeshap", "path"):
        ours_t = best_time(lambda m=method: model.contributions(Xc, m, n_threads=1), 3)
        lib = library_contribs(bm, Xc, method)
        lib_t = best_time(lib, 1 if key in ("B", "C") else 3)
        ours = model.contributions(Xc, method, n_threads=1)
        ref = _as_margin_rows(lib(), model.n_features)
        ours_f = ours[:, :model.n_features] if ours.ndim == 2 else ours[:, -1, :-1]
        row[method] = {"ours_rows_s": n / ours_t, "library_rows_s": n / lib_t,
                       "speedup": lib_t / ours_t,
                       "max_abs_diff": float(np.max(np.abs(ours_f - ref)))}
        print(f"{key} {method:>8}: ours {n / ours_t:>10,.0f} rows/s, library "
              f"{n / lib_t:>9,.0f} ({lib_t / ours_t:.1f}x), max |diff| "
              f"{row[method]['max_abs_diff']:.2g}", flush=True)
    # scoring with reason codes for the flagged rows
    Xb = np.ascontiguousarray(X[:batch])
    plain_t = best_time(lambda: model.score_batch(Xb, thresholds=[0.5], n_threads=1), 5)
    score = model.score_batch(Xb, thresholds=[0.5], n_threads=1).score
    row["flagged"] = {}
    for frac in (0.01, 0.10):
        cut = float(np.quantile(score, 1 - frac))
        for method in ("treeshap", "path"):
            cost, t, rounds = paired_cost(
                lambda c=cut: model.score_batch(Xb, thresholds=[c], n_threads=1),
                lambda c=cut, m=method: model.score_batch(
                    Xb, thresholds=[c], explain=m, top_k=3, n_threads=1),
                3 if key in ("B", "C") and method == "treeshap" else 9)
            row["flagged"][f"{frac:.0%} {method}"] = {"rows_s": Xb.shape[0] / t,
                                                      "cost": cost, "rounds": rounds}
            print(f"{key} explain {method:>8} at {frac:.0%} flagged: {cost:.2f}x "
                  f"scoring alone ({Xb.shape[0] / t:,.0f} rows/s; rounds "
                  f"{min(rounds):.2f}-{max(rounds):.2f})", flush=True)
    row["score_rows_s"] = Xb.shape[0] / plain_t
    return row


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def report(res: dict) -> str:
    m = res["machine"]
    lines = ["# Reason codes: results", "",
             "Produced by `make bench-explain` (`python bench/explain.py`); 1 thread, every "
             "figure from the same run.", "",
             f"Machine: {m['cpu']}, {m['cpus']} usable CPUs, Python {m['python']}, {m['when']}.",
             "", "## Targets (issue 14), this run", "",
             "| target | measured | goal | |", "|---|---|---|---|"]
    for key in ("A", "B"):
        s = res["models"][key]["treeshap"]["speedup"]
        lines.append(f"| exact TreeSHAP on {key} against XGBoost `pred_contribs` | {s:.2f}x | "
                     f">= 5x | {'met' if s >= 5 else 'missed'} |")
    for method in ("treeshap", "path"):
        costs = {k: res["models"][k]["flagged"][f"1% {method}"]["cost"] for k in res["models"]}
        worst = max(costs.values())
        each = ", ".join(f"{k} {c:.2f}x" for k, c in costs.items())
        lines.append(f"| scoring with `explain: {method}` at 1% flagged, worst of A-D | "
                     f"{worst:.2f}x scoring alone ({each}) | <= 1.3x | "
                     f"{'met' if worst <= 1.3 else 'missed'} |")
    lines += ["", "## All contributions (rows/s, 1 thread)", "",
              "| model | method | ours | library | ours / library | max abs diff |",
              "|---|---|---|---|---|---|"]
    for key, row in res["models"].items():
        lib = "XGBoost" if key in ("A", "B") else "shap.TreeExplainer"
        for method in ("treeshap", "path"):
            r = row[method]
            lines.append(f"| {key}: {row['title']} ({row['rows']} rows) | {method} | "
                         f"{r['ours_rows_s']:,.0f} | {r['library_rows_s']:,.0f} ({lib}) | "
                         f"{r['speedup']:.1f}x | {r['max_abs_diff']:.2g} |")
    lines += ["", "## Scoring with reason codes for the flagged rows (top 3; batches of "
              "10,000 rows, 2,000 for B and C)", "",
              "Cost: the median of rounds that each time one scoring call without and one with "
              "`explain`, alternated (9 rounds; 3 for TreeSHAP on B and C); rows/s with "
              "`explain`: the median of its calls.",
              "", "| model | scoring alone, rows/s | flagged | method | rows/s | cost | rounds |",
              "|---|---|---|---|---|---|---|"]
    for key, row in res["models"].items():
        for name, r in row["flagged"].items():
            frac, method = name.split()
            spread = (f"{min(r['rounds']):.2f}-{max(r['rounds']):.2f}x" if "rounds" in r
                      else "")  # results.json of before the rounds
            lines.append(f"| {key} | {row['score_rows_s']:,.0f} | {frac} | {method} | "
                         f"{r['rows_s']:,.0f} | {r['cost']:.2f}x | {spread} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    result = run(args.quick)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(result, indent=1))
    if not args.quick:
        (REPO / "bench" / "EXPLAIN-RESULTS.md").write_text(report(result))
    print(report(result))
