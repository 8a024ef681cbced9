"""Models E and F: LightGBM and XGBoost with categorical features, against the libraries and
lleaves (bench/CATEGORICAL-RESULTS.md). Run from the repository root:

    python bench/categorical.py

E: LightGBM binary, 500 trees of 63 leaves, 28 numerical and 4 categorical features (channel
8 values, device 12, country 200, merchant category 300). F: XGBoost binary:logistic with
partition splits on the same data, 300 rounds of depth 6. Measured in one run, same rows:
batch rows/s at 1 and 2 threads (50,000 rows, dense and with 5% missing values) and one-row
latency from Python. lleaves needs llvmlite < 0.45 (its PassManagerBuilder), which numba (for
shap) cannot share: it runs in its own virtualenv (bench/out/lleaves-venv, made on first use)
in a child process on the same rows, and its compiled model is cached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import report  # noqa: E402

import worker  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
CACHE = OUT / "cache"
LLEAVES_VENV = OUT / "lleaves-venv"
N_NUM, CARD = 28, (8, 12, 200, 300)  # numerical features; categorical cardinalities
N_ROWS = 50_000


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, N_NUM + len(CARD))).astype(np.float32)
    for j, k in enumerate(CARD):
        # skewed category frequencies, as merchant categories and countries are
        X[:, N_NUM + j] = np.minimum(rng.zipf(1.3, n) - 1, k - 1)
    cat = X[:, N_NUM:].astype(np.int64)
    effect = np.sin(cat[:, 2] * 0.7) + (cat[:, 3] % 7 == 0) * 1.2 - (cat[:, 0] == 3) * 0.8 \
        + 0.05 * cat[:, 1]
    z = X[:, 0] + X[:, 1] * X[:, 2] - 0.7 * np.abs(X[:, 3]) + effect \
        + 0.2 * X[:, 5:20].sum(axis=1) + rng.normal(scale=0.8, size=n)
    return X, (z > 0.5).astype(np.int32)


def with_missing(X: np.ndarray, seed: int, frac: float = 0.05) -> np.ndarray:
    X = X.copy()
    X[np.random.default_rng(seed).random(X.shape) < frac] = np.nan
    return X


CATS = list(range(N_NUM, N_NUM + len(CARD)))


def model_e():
    import lightgbm as lgb

    path = CACHE / "model_E.txt"
    if not path.exists():
        X, y = data(100_000, seed=1)
        params = {"objective": "binary", "num_leaves": 63, "learning_rate": 0.05,
                  "min_data_per_group": 50, "cat_smooth": 10, "verbose": -1, "seed": 0,
                  "num_threads": 2}
        booster = lgb.train(params, lgb.Dataset(with_missing(X, 2), y,
                                                categorical_feature=CATS), 500)
        CACHE.mkdir(parents=True, exist_ok=True)
        booster.save_model(str(path))
    return path, lgb.Booster(model_file=str(path))


def model_f():
    import xgboost as xgb

    path = CACHE / "model_F.json"
    if not path.exists():
        X, y = data(100_000, seed=1)
        types = ["q"] * N_NUM + ["c"] * len(CARD)
        dm = xgb.DMatrix(with_missing(X, 2), label=y, feature_types=types,
                         enable_categorical=True)
        params = {"objective": "binary:logistic", "max_depth": 6, "eta": 0.1, "seed": 0,
                  "tree_method": "hist", "max_cat_to_onehot": 1, "nthread": 2}
        xgb.train(params, dm, 300).save_model(str(path))
    booster = xgb.Booster()
    booster.load_model(str(path))
    return path, booster


def best_rate(fn, n_rows: int, budget: float = 3.0) -> float:
    """Rows/s of the median of timed calls (after a warm-up), for about ``budget`` seconds."""
    fn()
    times, start = [], time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 15):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n_rows / float(np.median(times))


def latency(fn, rows: np.ndarray, n: int = 20_000) -> dict:
    views = [rows[i:i + 1] for i in range(rows.shape[0])]
    for v in views[:100]:
        fn(v)
    ns = np.empty(n, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(n):
        v = views[i % len(views)]
        t0 = clock()
        fn(v)
        ns[i] = clock() - t0
    us = ns / 1e3
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99))}


LLEAVES_DRIVER = r"""
import json, sys, time
import numpy as np
import lleaves
model_file, so, x_dense, x_missing = sys.argv[1:5]
m = lleaves.Model(model_file=model_file)
t0 = time.perf_counter()
m.compile(cache=so)
compile_s = time.perf_counter() - t0
out = {"compile_s": compile_s}
for name, path in (("dense", x_dense), ("missing", x_missing)):
    X = np.load(path).astype(np.float64)
    out[name + "_pred"] = m.predict(X, n_jobs=1).tolist()
    for threads in (1, 2):
        m.predict(X, n_jobs=threads)
        times = []
        start = time.perf_counter()
        while len(times) < 3 or (time.perf_counter() - start < 3 and len(times) < 15):
            t = time.perf_counter(); m.predict(X, n_jobs=threads)
            times.append(time.perf_counter() - t)
        out[f"{name}_{threads}"] = X.shape[0] / float(np.median(times))
X = np.load(x_dense).astype(np.float64)
views = [X[i:i + 1] for i in range(2000)]
for v in views[:100]:
    m.predict(v, n_jobs=1)
ns = []
for i in range(5000):
    t = time.perf_counter_ns(); m.predict(views[i % 2000], n_jobs=1)
    ns.append(time.perf_counter_ns() - t)
us = np.asarray(ns) / 1e3
out["latency"] = {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99))}
print(json.dumps(out))
"""


def lleaves_venv() -> Path:
    py = LLEAVES_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(LLEAVES_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "llvmlite<0.45", "lleaves==1.3.0",
                        "numpy"], check=True)
    return py


def run_lleaves(model_file: Path, x_dense: Path, x_missing: Path) -> dict:
    so = CACHE / "model_E.lleaves.so"
    t0 = time.perf_counter()
    done = subprocess.run([str(lleaves_venv()), "-c", LLEAVES_DRIVER, str(model_file), str(so),
                           str(x_dense), str(x_missing)], capture_output=True, text=True,
                          check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    results = {"machine": report.machine(), "started": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                        time.gmtime())}
    X, _ = data(N_ROWS, seed=7)
    Xm = with_missing(X, seed=8)
    CACHE.mkdir(parents=True, exist_ok=True)
    x_dense, x_missing = CACHE / "E_rows_dense.npy", CACHE / "E_rows_missing.npy"
    np.save(x_dense, X)
    np.save(x_missing, Xm)

    # ---- E: LightGBM ----
    path, booster = model_e()
    model = worker.compile_model(path)
    walk = worker.compile_model(path, kernel="walk")  # the other candidate, for the record
    e = {"trees": model.n_trees, "layout": model.layout, "kernel": model.kernel_choice,
         "special_nodes": int(((model.arrays["cnodes"][:, 0] & 0xC0000000) == 0x40000000)
                              .sum()),
         "split_nodes": int((model.arrays["cnodes"][:, 0] & 0x80000000 == 0).sum())}
    for name, rows in (("dense", X), ("missing", Xm)):
        rows64 = rows.astype(np.float64)
        ref = booster.predict(rows64, raw_score=True)
        e[f"{name}_bit_identical"] = bool(np.array_equal(model.raw(rows)[:, 0], ref)
                                          and np.array_equal(walk.raw(rows)[:, 0], ref))
        for threads in (1, 2):
            e[f"{name}_ours_{threads}"] = best_rate(
                lambda r=rows, t=threads: model.predict_proba(r, n_threads=t), N_ROWS)
            e[f"{name}_walk_{threads}"] = best_rate(
                lambda r=rows, t=threads: walk.predict_proba(r, n_threads=t), N_ROWS)
            e[f"{name}_lightgbm_{threads}"] = best_rate(
                lambda r=rows64, t=threads: booster.predict(r, num_threads=t), N_ROWS)
    one = X[:2000].copy()
    e["latency_ours"] = latency(model.predict_proba, one)
    e["latency_walk"] = latency(walk.predict_proba, one)
    e["latency_lightgbm"] = latency(lambda r: booster.predict(r.astype(np.float64),
                                                              num_threads=1), one, 5000)
    try:
        ll = run_lleaves(path, x_dense, x_missing)
        ref = booster.predict(X.astype(np.float64))
        e["lleaves_max_diff"] = float(np.abs(np.asarray(ll.pop("dense_pred")) - ref).max())
        ll.pop("missing_pred")
        e["lleaves"] = ll
    except (subprocess.CalledProcessError, OSError, ValueError) as exc:
        e["lleaves_error"] = str(exc)[:500]
    results["E"] = e

    # ---- F: XGBoost ----
    path, booster = model_f()
    model = worker.compile_model(path)
    f = {"trees": model.n_trees, "layout": model.layout, "kernel": model.kernel_choice}
    for name, rows in (("dense", X), ("missing", Xm)):
        ref = booster.inplace_predict(rows, predict_type="margin")
        f[f"{name}_bit_identical"] = bool(np.array_equal(
            model.raw(rows)[:, 0].astype(np.float32), ref))
        for threads in (1, 2):
            f[f"{name}_ours_{threads}"] = best_rate(
                lambda r=rows, t=threads: model.predict_proba(r, n_threads=t), N_ROWS)
            booster.set_param({"nthread": threads})
            f[f"{name}_xgboost_{threads}"] = best_rate(
                lambda r=rows: booster.inplace_predict(r), N_ROWS)
    booster.set_param({"nthread": 1})
    f["latency_ours"] = latency(model.predict_proba, one)
    f["latency_xgboost"] = latency(lambda r: booster.inplace_predict(r), one)
    results["F"] = f
    OUT.mkdir(exist_ok=True)
    (OUT / "categorical.json").write_text(json.dumps(results, indent=1))
    write_report(results)


def _kernel_text(k: dict) -> str:
    us = k.get("us_per_row") or {}
    timed = ", ".join(f"{n} {v:.2f} us" for n, v in us.items())
    return f"{k['kernel']}" + (f" (per probe row: {timed})" if timed else "") + (
        f"; {k['reason']}" if k.get("reason") else "")


def write_report(r: dict) -> None:
    e, f, m = r["E"], r["F"], r["machine"]
    ll = e.get("lleaves", {})
    L = ["# Categorical models: results", "",
         f"`python bench/categorical.py`, run {r['started']}. Machine: "
         f"{m.get('Model name', '?')} ({m.get('platform')}; L2 {m.get('L2 cache', '?')}), "
         f"{m.get('cpus_usable')} usable CPUs, "
         f"Python {m['python']}. 50,000 rows per batch; \"missing\": 5% of values NaN. "
         "Rows/s are medians of repeated calls; one-row latency is per call from Python.", "",
         f"E: LightGBM binary, {e['trees']} trees of 63 leaves, 4 categorical features (8, 12, "
         f"200, 300 values); {e['special_nodes']} of its {e['split_nodes']} splits are "
         f"categorical. Compiled layout: {e['layout']}; kernel chosen at load: "
         f"{_kernel_text(e['kernel'])}. Our raw score equals LightGBM's "
         f"`predict(raw_score=True)` bit for bit (both kernels): dense "
         f"{e['dense_bit_identical']}, with missing values {e['missing_bit_identical']}. "
         f"lleaves agrees with LightGBM to {e.get('lleaves_max_diff', float('nan')):.1e}.", "",
         f"| E (LightGBM) | ours ({e['kernel']['kernel']}) | ours (walk) | LightGBM | lleaves | "
         "ours / LightGBM | ours / lleaves |",
         "|---|---|---|---|---|---|---|"]
    for name in ("dense", "missing"):
        for t in (1, 2):
            ours, wk, lg, lv = e[f"{name}_ours_{t}"], e[f"{name}_walk_{t}"], \
                e[f"{name}_lightgbm_{t}"], ll.get(f"{name}_{t}", float("nan"))
            L.append(f"| {name}, {t} thread{'s' * (t > 1)}, rows/s | {ours:,.0f} | {wk:,.0f} | "
                     f"{lg:,.0f} | {lv:,.0f} | {ours / lg:.2f}x | {ours / lv:.2f}x |")
    lo, lw, lgl, lll = e["latency_ours"], e["latency_walk"], e["latency_lightgbm"], \
        ll.get("latency", {})
    L.append(f"| one row p50 / p99, us | {lo['p50']:.1f} / {lo['p99']:.1f} | "
             f"{lw['p50']:.1f} / {lw['p99']:.1f} | "
             f"{lgl['p50']:.1f} / {lgl['p99']:.1f} | {lll.get('p50', float('nan')):.1f} / "
             f"{lll.get('p99', float('nan')):.1f} | | |")
    cs = ll.get("compile_s", float("nan"))
    L += ["", f"lleaves' `compile` took {cs:.1f} s in this run ("
          + ("it loaded its cached build of E; a first build takes minutes" if cs < 10 else
             "a first build of E: later runs load its cache") + "). "
          "Models without categorical splits: bench/NOTES.md, \"Categorical splits\" (A-D "
          "before and after, same speed within noise).", "",
          f"F: XGBoost binary:logistic, {f['trees']} trees of depth 6 with partition splits on "
          f"the same 4 features. Layout {f['layout']}, kernel {_kernel_text(f['kernel'])}. "
          f"Margins equal XGBoost's in float32 bit "
          f"for bit: dense {f['dense_bit_identical']}, missing {f['missing_bit_identical']}.",
          "", "| F (XGBoost) | ours | XGBoost `inplace_predict` | ours / XGBoost |",
          "|---|---|---|---|"]
    for name in ("dense", "missing"):
        for t in (1, 2):
            ours, xg = f[f"{name}_ours_{t}"], f[f"{name}_xgboost_{t}"]
            L.append(f"| {name}, {t} thread{'s' * (t > 1)}, rows/s | {ours:,.0f} | {xg:,.0f} | "
                     f"{ours / xg:.2f}x |")
    lo, lx = f["latency_ours"], f["latency_xgboost"]
    L.append(f"| one row p50 / p99, us | {lo['p50']:.1f} / {lo['p99']:.1f} | "
             f"{lx['p50']:.1f} / {lx['p99']:.1f} | |")
    (Path(__file__).resolve().parent / "CATEGORICAL-RESULTS.md").write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
