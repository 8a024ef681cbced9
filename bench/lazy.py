"""Lazy stopping benchmark: work units, wall-clock and disagreement with the full model.

    python bench/lazy.py [--quick]

Datasets: a synthetic fraud-like set (~1.5% positives), scikit-learn digits (10 classes) and
breast_cancer. Models: RandomForest 100 trees, GradientBoosting 100 x depth 3, XGBoost 300 x
depth 6. Every model is first checked against its library (probabilities within 1e-5), then
timed: our full evaluation (lazy off), each lazy policy, and the library's own predict_proba,
all with the same thread count. Disagreement = rows whose decision band or label differs from
full evaluation. Writes bench/LAZY-RESULTS.md and bench/lazy-work-units.png.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import worker  # noqa: E402
from worker.model.result import default_threads  # noqa: E402

HERE = Path(__file__).resolve().parent
THRESHOLDS = {"fraud": [0.5, 0.9], "breast_cancer": [0.5, 0.9], "digits": [0.5]}
TIMING_ROWS = 50_000


def datasets(quick: bool):
    from sklearn.datasets import load_breast_cancer, load_digits, make_classification
    from sklearn.model_selection import train_test_split

    n = 30_000 if quick else 100_000
    X, y = make_classification(n_samples=n, n_features=30, n_informative=12, n_redundant=6,
                               weights=[0.985], flip_y=0.003, class_sep=1.2, random_state=0)
    out = {"fraud": train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)}
    for name, loader in (("digits", load_digits), ("breast_cancer", load_breast_cancer)):
        d = loader()
        out[name] = train_test_split(d.data, d.target, test_size=0.3, random_state=0,
                                     stratify=d.target)
    return out


def models(Xtr, ytr, threads: int):
    import xgboost as xgb
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

    return {
        "RF 100": RandomForestClassifier(n_estimators=100, n_jobs=threads,
                                         random_state=0).fit(Xtr, ytr),
        "GBM 100x3": GradientBoostingClassifier(n_estimators=100, max_depth=3,
                                                random_state=0).fit(Xtr, ytr),
        "XGB 300x6": xgb.XGBClassifier(n_estimators=300, max_depth=6, n_jobs=threads,
                                       tree_method="hist", random_state=0).fit(Xtr, ytr),
    }


def best_time(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def library_proba(est, X):
    if hasattr(est, "get_booster"):
        return est.get_booster().inplace_predict(X)
    return est.predict_proba(X)


def policies(kind: str):
    out = [("certified", {})]
    if kind.startswith("RF"):
        out.append(("lazyrf", {}))
    else:
        out += [("lazygbm", {}), ("lazygbm", {"variant": "certificate_only"})]
    return out


def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                     if line.startswith("Model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown"
    return (f"{model}; {os.cpu_count()} logical cores ({default_threads()} usable); "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller data, fewer repeats")
    ap.add_argument("--out", default=str(HERE / "LAZY-RESULTS.md"))
    args = ap.parse_args()
    threads = default_threads()
    repeat = 3 if args.quick else 7
    rows, hist = [], {}
    for dname, (Xtr, Xte, ytr, yte) in datasets(args.quick).items():
        Xte = Xte.astype(np.float32)
        reps = -(-TIMING_ROWS // Xte.shape[0])
        Xt = np.ascontiguousarray(np.tile(Xte, (reps, 1))[:TIMING_ROWS])
        thr = THRESHOLDS[dname]
        print(f"[{dname}] train {Xtr.shape}, test {Xte.shape}, timing rows {Xt.shape[0]}",
              flush=True)
        for mname, est in models(Xtr, ytr, threads).items():
            m = worker.compile_model(est)
            ref = np.asarray(library_proba(est, Xte), dtype=np.float64)
            ours = m.predict_proba(Xte)
            ours = ours[:, 1] if ref.ndim == 1 else ours
            err = float(np.max(np.abs(ours - ref)))
            assert err <= 1e-5, f"{dname}/{mname}: compiled model differs by {err}"
            full = m.score_batch(Xte, thresholds=thr)
            t_full = best_time(lambda m=m, thr=thr, Xt=Xt: m.score_batch(Xt, thresholds=thr),
                               repeat)
            t_lib = best_time(lambda est=est, Xt=Xt: library_proba(est, Xt), repeat)
            acc = float((full.label == np.searchsorted(m.classes, yte)).mean())
            rows.append((dname, mname, "off (full)", m.work_total, float(m.work_total), 0.0,
                         0.0, t_full, 1.0, t_full / t_full, t_lib, acc))
            for pol, params in policies(mname):
                r = m.score_batch(Xte, lazy=pol, thresholds=thr, **params)
                dis_dec = float((r.decision != full.decision).mean())
                dis_lab = float((r.label != full.label).mean())
                t = best_time(lambda m=m, pol=pol, params=params, thr=thr, Xt=Xt:
                              m.score_batch(Xt, lazy=pol, thresholds=thr, **params), repeat)
                label = pol + (f" ({params['variant']})" if params else "")
                acc = float((r.label == np.searchsorted(m.classes, yte)).mean())
                rows.append((dname, mname, label, m.work_total, float(r.work_units.mean()),
                             dis_dec, dis_lab, t, t_full / t, t_lib / t, t_lib, acc))
                hist[(dname, mname, label)] = r.work_units / m.work_total
                print(f"  {mname:10s} {label:32s} work {r.work_units.mean():7.1f}/"
                      f"{m.work_total:<5d} dis(decision) {dis_dec:.4%} dis(label) {dis_lab:.4%}"
                      f"  {t * 1e3:8.1f} ms  x{t_full / t:5.2f} vs full  x{t_lib / t:6.2f} "
                      f"vs library", flush=True)
    write_results(args.out, rows, threads, repeat)
    plot(hist, HERE / "lazy-work-units.png")
    return 0


def write_results(path, rows, threads, repeat):
    lines = [
        "# Lazy stopping: measured results",
        "",
        f"Machine: {machine()}. Threads: {threads} (ours and the libraries').",
        f"Command: `python bench/lazy.py`. Timings: best of {repeat}, {TIMING_ROWS} rows "
        "(the test split tiled) through `score_batch` (numpy in, results out) against the "
        "library's `predict_proba` (XGBoost: `inplace_predict`). Work and disagreement: on "
        "the test split. Disagreement: share of rows whose decision band (thresholds "
        "0.5/0.9, digits 0.5) or label differs from our full evaluation, which equals the "
        "library within 1e-5 (checked first).",
        "",
        "| data | model | policy | work units (mean / total) | work % | decision dis. | "
        "label dis. | time ms | x vs our full | x vs library | test accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d, mname, pol, total, work, dd, dl, t, sf, sl, _tlib, acc in rows:
        lines.append(f"| {d} | {mname} | {pol} | {work:.1f} / {total} | {work / total:.1%} | "
                     f"{dd:.3%} | {dl:.3%} | {t * 1e3:.1f} | {sf:.2f} | {sl:.2f} | {acc:.4f} |")
    lines += ["", "Work units per record: `bench/lazy-work-units.png`.", ""]
    # the hand-written reading of the numbers: linked, not copied
    lines += ["What these figures mean: [LAZY-NOTES.md](LAZY-NOTES.md).", ""]
    Path(path).write_text("\n".join(lines))
    print(f"wrote {path}")


def plot(hist, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(d, m) for d, m, _ in hist})
    cols = 3
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    bins = np.linspace(0, 1, 41)
    for ax, (d, m) in zip(axes.ravel(), groups, strict=False):
        for (d2, m2, pol), frac in hist.items():
            if (d2, m2) == (d, m):
                ax.hist(frac, bins=bins, histtype="step", linewidth=1.5,
                        label=f"{pol} (mean {frac.mean():.0%})")
        ax.set_title(f"{d} / {m}", fontsize=9)
        ax.set_xlabel("work units evaluated / total")
        ax.set_ylabel("records")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    for ax in axes.ravel()[len(groups):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
