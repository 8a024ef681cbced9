"""Machine description, target verdicts, RESULTS.md and the PNG charts."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from importlib import metadata
from pathlib import Path

ENGINE_ORDER = ["ours", "xgboost", "sklearn", "tl2cgen"]
COLORS = {"ours": "#1b7837", "xgboost": "#2166ac", "sklearn": "#f4a582", "tl2cgen": "#762a83"}



def scaling_speedup(s: dict) -> float:
    """2 threads over 1: the median of the rounds' own speed-ups (run.py), or for a results
    file from before the rounds the ratio of the two rates."""
    rounds = s.get("rounds")
    return statistics.median(rounds) if rounds else s["2"] / s["1"]


def machine() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cpus_usable": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket",
                             "L1d cache", "L2 cache", "L3 cache", "Hypervisor vendor",
                             "CPU family"):
                info[k.strip()] = v.strip()
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            info["mhz"] = next(float(line.split(":")[1]) for line in f
                               if line.startswith("cpu MHz"))
    except (OSError, StopIteration, ValueError):
        pass
    try:
        info["gcc"] = subprocess.run(["gcc", "--version"], capture_output=True,
                                     text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        info["gcc"] = "gcc ?"
    info["versions"] = {}
    for pkg in ("scoring-worker", "numpy", "Cython", "xgboost", "scikit-learn", "treelite",
                "tl2cgen", "matplotlib"):
        try:
            info["versions"][pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info["versions"][pkg] = "absent"
    return info


def _t(name, value, goal, met):
    return {"target": name, "value": value, "goal": goal, "met": met}


def targets(res) -> list[dict]:
    out = []
    want = {"A": [("xgboost", 3.0), ("tl2cgen", 1.5)], "B": [("xgboost", 3.0), ("tl2cgen", 1.5)],
            "C": [("sklearn", 2.0), ("tl2cgen", 1.5)], "D": [("sklearn", 2.0), ("tl2cgen", 1.5)]}
    for key, r in res["models"].items():
        tp = r["throughput"]
        for other, goal in want[key]:
            if other in tp:
                ratio = tp["ours"]["1"]["rows_per_s"] / tp[other]["1"]["rows_per_s"]
                out.append(_t(f"{key}: 1 thread vs {other}", ratio, f">= {goal}x",
                              ratio >= goal))
        for n, s in r["scaling"].items():
            if int(n) >= 10_000:
                ratio = scaling_speedup(s)
                out.append(_t(f"{key}: 2 threads / 1 thread, {int(n):,} rows", ratio, ">= 1.8x",
                              ratio >= 1.8))
    if "A" in res["models"]:
        p50 = res["models"]["A"]["latency_py"]["ours"]["p50"]
        out.append(_t("A: single row predict_proba from Python, p50", p50, "<= 5 us", p50 <= 5))
    for key, goal in (("A", 1.0), ("B", 10.0)):
        ln = res["models"].get(key, {}).get("latency_native")
        if ln:
            out.append(_t(f"{key}: single row inside native code, p99", ln["p99"],
                          f"<= {goal:g} us", ln["p99"] <= goal))
    return out


# Issue 16's targets, 1 thread, batches of the throughput table: each model against its
# library on rows with and without missing values, single-row latency, thread scaling.
V2_RATIO = {"A": "xgboost", "B": "xgboost", "C": "sklearn", "D": "sklearn"}


def loads_per_cycle(machine_info: dict) -> int:
    """Loads a core issues per cycle: 4 on AMD Zen 5 (CPU family 26), 3 on Zen 2-4 and on
    Intel since Sunny Cove (the vendors' optimisation guides)."""
    return 4 if machine_info.get("CPU family") == "26" else 3


def load_bound(r: dict, machine_info: dict) -> dict | None:
    """The load-port bound of a padded model's walk: per row, trees x depth steps of three
    loads (the node's two words and the row's value) and one leaf load per tree, at the
    clock the guest reports (cpu MHz: the nominal rate; a boosting core runs faster)."""
    shape = r.get("shape")
    mhz = machine_info.get("mhz")
    if not shape or shape["layout"] != "padded" or not mhz:
        return None
    loads = shape["n_trees"] * (3 * shape["depth"] + 1)
    per_s = mhz * 1e6 * loads_per_cycle(machine_info) / loads
    return {"loads_per_row": loads, "rows_per_s": per_s}


def v2_targets(res) -> list[dict]:
    out = []
    for key, r in res["models"].items():
        kinds = r.get("throughput_kinds", {})
        for kind in ("dense", "missing"):
            tp = kinds.get(kind, {})
            lib = V2_RATIO[key]
            if "ours" in tp and lib in tp:
                ratio = tp["ours"]["rows_per_s"] / tp[lib]["rows_per_s"]
                rows = "without" if kind == "dense" else "with"
                out.append(_t(f"{key}: 1 thread vs {lib}, rows {rows} missing values", ratio,
                              ">= 3.0x", ratio >= 3.0))
    if "A" in res["models"]:
        p50 = res["models"]["A"]["latency_py"]["ours"]["p50"]
        out.append(_t("A: single row predict_proba from Python, p50", p50, "<= 1.5 us",
                      p50 <= 1.5))
    for key, r in res["models"].items():
        for n, s in r["scaling"].items():
            if int(n) >= 10_000:
                ratio = scaling_speedup(s)
                out.append(_t(f"{key}: 2 threads / 1 thread, {int(n):,} rows", ratio,
                              ">= 1.85x", ratio >= 1.85))
    return out


def v3_targets(res) -> list[dict]:
    """Issue 56's targets: A and B at least 4x XGBoost at one thread, dense and with missing
    values, the smaller of each model's two first; A's single row from Python at most 1.2 us.
    (CatBoost's and ONNX Runtime's are in CATBOOST-RESULTS.md and ONNX-RESULTS.md.)"""
    out = []
    for key in ("A", "B"):
        kinds = res["models"].get(key, {}).get("throughput_kinds", {})
        got = []
        for kind in ("dense", "missing"):
            tp = kinds.get(kind, {})
            if "ours" in tp and "xgboost" in tp:
                ratio = tp["ours"]["rows_per_s"] / tp["xgboost"]["rows_per_s"]
                rows = "without" if kind == "dense" else "with"
                got.append(_t(f"{key}: 1 thread vs xgboost, rows {rows} missing values", ratio,
                              ">= 4.0x", ratio >= 4.0))
        out += sorted(got, key=lambda t: t["value"])
    if "A" in res["models"]:
        p50 = res["models"]["A"]["latency_py"]["ours"]["p50"]
        out.append(_t("A: single row predict_proba from Python, p50", p50, "<= 1.2 us",
                      p50 <= 1.2))
    return out


def v2_section(res) -> list[str]:
    """Every model on rows with and without missing values, the load-port bound, and issues
    16's and 56's targets."""
    m = res["machine"]
    L = ["## Kernel v2 (issue 16): rows with and without missing values, 1 thread", "",
         "| model | rows | ours | library | ours / library | ours / load-port bound |",
         "|---|---|---|---|---|---|"]
    for key, r in res["models"].items():
        lib = V2_RATIO[key]
        # the walks' bound: a model on another kernel (lanes.h reads no node a row) has none
        bound = load_bound(r, m) if (r.get("kernel") or {}).get("kernel", "walk") == "walk" \
            else None
        for kind, tp in r.get("throughput_kinds", {}).items():
            if "ours" not in tp:
                continue
            ours = tp["ours"]["rows_per_s"]
            other = tp.get(lib, {}).get("rows_per_s")
            label = "without missing" if kind == "dense" else "2% missing"
            vs = f"{lib} {other:,.0f} | {ours / other:.2f}x" if other else f"{lib} rejects NaN | -"
            frac = f"{ours / bound['rows_per_s']:.0%}" if bound else "-"
            L.append(f"| {key} | {label} | {ours:,.0f} | {vs} | {frac} |")
    L.append("")
    if m.get("mhz"):
        L.append(f"Load-port bound: per row, trees x depth steps of three loads (the node's two "
                 f"words, the row's value) and a leaf load per tree, at "
                 f"{loads_per_cycle(m)} loads per cycle (CPU family {m.get('CPU family', '?')})"
                 f" and {m['mhz']:,.0f} MHz, the clock the guest reports (/proc/cpuinfo: the "
                 "nominal rate; a boosting core is faster, so the fraction can pass 100%). "
                 "Padded models only; C's compact walk is bound by memory latency instead.")
        L.append("")
    for issue, name in (("issue 16", "targets_v2"), ("issue 56, kernel v3", "targets_v3")):
        if name not in res:
            continue
        L += [f"| target ({issue}) | measured | goal | met |", "|---|---|---|---|"]
        for t in res[name]:
            unit = "x" if "x" in t["goal"] else " us"
            L.append(f"| {t['target']} | {t['value']:.2f}{unit} | {t['goal']} | "
                     f"{'yes' if t['met'] else '**no**'} |")
        L.append("")
    return L


def _kernel(k: dict | None) -> str:
    """The layout and kernel, how they were chosen, each candidate's us per probe row, and
    why a kernel was not a candidate."""
    if not k:
        return "walk"
    us = ", ".join(f"{n} {v:.3f}" for n, v in (k.get("us_per_row") or {}).items())
    head = (f"{k['layout']} {k['kernel']}" if "layout" in k else k["kernel"]) + (
        f", {k['by']}" if k.get("by") else "")
    nots = "; ".join(f"{n}: {r}" for n, r in (k.get("not_candidates") or {}).items())
    return head + (f" (us per probe row: {us})" if us else "") + (
        f"; not candidates: {nots}" if nots else
        f"; QuickScorer not taken: {k['reason']}" if k.get("reason") else "")


def _mb(b):
    return "-" if b is None else f"{b / 2**20:.2f} MB"


def write(res, out: Path, quick: bool = False) -> None:
    suffix = "-quick" if quick else ""
    charts = charts_png(res, out, suffix)
    m = res["machine"]
    L = []
    L.append("# Benchmark results" + (" (quick mode)" if quick else ""))
    L.append("")
    L.append(f"Generated by `{'python bench/run.py --quick' if quick else 'make bench'}` on "
             f"{m['date']} in {res['seconds']:.0f} s. Every engine's answers were checked against "
             "the model's own library (max |p - p_ref| <= 1e-5) before any timing.")
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append(f"- CPU: {m.get('Model name', '?')}, {m.get('CPU(s)', '?')} CPUs "
             f"({m.get('Core(s) per socket', '?')} cores x {m.get('Thread(s) per core', '?')} "
             f"threads), hypervisor {m.get('Hypervisor vendor', 'none')}; L1d "
             f"{m.get('L1d cache', '?')}, L2 {m.get('L2 cache', '?')}, L3 {m.get('L3 cache', '?')}")
    L.append(f"- {m['platform']}, Python {m['python']}, {m.get('gcc', '')}")
    L.append("- " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()))
    la, lb = m["load_before"], res.get("load_after", ("?",) * 3)
    L.append(f"- load average before {la[0]:.2f}, after {lb[0]:.2f} (2 cores shared with other "
             "work: medians of repeats)")
    cfg = res["config"]
    L.append(f"- batch {cfg['batch']:,} rows, median of up to {cfg['repeats']} timed calls after "
             f"one warm-up; Python single-row latency over up to {cfg['py_calls']:,} calls "
             "(slow engines stop after a time budget: see n); native latency over "
             f"{cfg['native_calls']:,} calls")
    L.append("")
    L.append("## Models")
    L.append("")
    L.append("| model | ours: layout | layout and kernel (chosen when compiled, 1 thread) | "
             "hot arrays | answer check: max abs diff vs reference |")
    L.append("|---|---|---|---|---|")
    for key, r in res["models"].items():
        chk = ", ".join(f"{k} {v:.1e}" for k, v in r["check"].items())
        L.append(f"| {key}: {r['title']} | {r['ours']} | {_kernel(r.get('kernel'))} | "
                 f"{_mb(r['hot_bytes'])} | vs {r['reference']}: {chk} |")
    L.append("")
    L.append("## Batch throughput (rows/s, median)")
    L.append("")
    L.append("| model | threads | " + " | ".join(ENGINE_ORDER) + " | ours / best other |")
    L.append("|---|---|" + "---|" * (len(ENGINE_ORDER) + 1))
    for key, r in res["models"].items():
        tp = r["throughput"]
        for k in ("1", "2"):
            cells = []
            for e in ENGINE_ORDER:
                if e not in tp:
                    cells.append("-")
                    continue
                note = "" if r["native_threads"].get(e, True) or k == "1" else " (1 thread)"
                cells.append(f"{tp[e][k]['rows_per_s']:,.0f}{note}")
            best = max(v[k]["rows_per_s"] for e, v in tp.items() if e != "ours")
            L.append(f"| {key} | {k} | " + " | ".join(cells)
                     + f" | {tp['ours'][k]['rows_per_s'] / best:.2f}x |")
    L.append("")
    fin = {k: r["throughput_finite"] for k, r in res["models"].items()
           if "throughput_finite" in r}
    if fin:
        L.append("")
        L.append("A and B above score rows with 2% of values missing (73% of rows have a NaN). "
                 "On rows without NaN, 1 thread: " + "; ".join(
                     f"{k} ours {v['ours']['rows_per_s']:,.0f}, xgboost "
                     f"{v['xgboost']['rows_per_s']:,.0f} rows/s "
                     f"({v['ours']['rows_per_s'] / v['xgboost']['rows_per_s']:.2f}x)"
                     for k, v in fin.items()) + ".")
    L.append("")
    L.append("Thread counts set explicitly: ours `n_threads`, XGBoost `nthread`, scikit-learn "
             "`n_jobs` (GradientBoosting predicts on one thread whatever you ask), TL2cgen "
             "`Predictor(nthread=)`. TL2cgen's batch time excludes wrapping the array in a "
             "`tl2cgen.DMatrix`.")
    L.append("")
    L.append("## Thread scaling (ours, rows/s)")
    L.append("")
    if "scaling_rounds" in res["config"]:
        L.append(f"{res['config']['scaling_rounds']} rounds over the models, 1- and 2-thread "
                 "calls alternated on the same batch within each (3 pairs a round for batches "
                 "above 10,000 rows, 9 for the others). The speed-up is the median of the "
                 "rounds' own speed-ups (last column: the spread this shared host's neighbours "
                 "put on the figure, a burst on either CPU slowing a 2-thread call); the rows/s "
                 "columns are the medians of all rounds' calls, so their ratio can differ from "
                 "it.")
    else:
        L.append("Each count's calls timed in a block of its own (results from before the "
                 "rounds).")
    L.append("")
    L.append("| model | batch rows | 1 thread | 2 threads | speed-up | rounds |")
    L.append("|---|---|---|---|---|---|")
    for key, r in res["models"].items():
        for n, s in r["scaling"].items():
            rounds = ", ".join(f"{v:.2f}" for v in s.get("rounds", []))
            L.append(f"| {key} | {int(n):,} | {s['1']:,.0f} | {s['2']:,.0f} | "
                     f"{scaling_speedup(s):.2f}x | {rounds} |")
    L.append("")
    def speedup(tp):
        return tp["2"]["rows_per_s"] / tp["1"]["rows_per_s"]

    L.append("Other engines, same batch as the throughput table (each count's calls in a block, "
             "as there), 2 threads / 1 thread: "
             + "; ".join(f"{key} " + ", ".join(
                 f"{e} {speedup(r['throughput'][e]):.2f}x"
                 for e in ENGINE_ORDER if e in r["throughput"] and e != "ours")
                 for key, r in res["models"].items()))
    L.append("")
    L.append("## Single-row latency (microseconds)")
    L.append("")
    L.append("From Python: one `(1, 64)` float32 row per call (ours `predict_proba`, XGBoost "
             "`inplace_predict`, scikit-learn `predict_proba`, TL2cgen `predict(DMatrix(row))`), "
             "1 thread, `time.perf_counter_ns` around each call.")
    L.append("")
    L.append("| model | engine | n | p50 | p99 | p99.9 | max |")
    L.append("|---|---|---|---|---|---|---|")
    for key, r in res["models"].items():
        for e in ENGINE_ORDER:
            lp = r["latency_py"].get(e)
            if lp:
                L.append(f"| {key} | {e} | {lp['n']:,} | {lp['p50']:.2f} | {lp['p99']:.2f} | "
                         f"{lp['p99.9']:.2f} | {lp['max']:.1f} |")
    L.append("")
    L.append("Inside native code (ours): a C loop calls the single-row evaluation (all trees, "
             "base + leaves in tree order) and times each call with `clock_gettime` "
             "(`worker._timing.bench_row_latency`, bench only); 5 rounds of n calls, each "
             "percentile the median over rounds.")
    L.append("")
    L.append("| model | n | p50 | p99 | p99.9 | max |")
    L.append("|---|---|---|---|---|---|")
    for key, r in res["models"].items():
        ln = r.get("latency_native")
        if ln:
            L.append(f"| {key} | {ln['n']:,} | {ln['p50']:.3f} | {ln['p99']:.3f} | "
                     f"{ln['p99.9']:.3f} | {ln['max']:.1f} |")
    L.append("")
    L.append("## Memory footprint")
    L.append("")
    L.append("RSS growth of a fresh process that loads the model and scores 1,000 rows with it "
             "(libraries imported first); `on disk` is the saved model / shared library.")
    L.append("")
    L.append("| model | " + " | ".join(f"{e} RSS | {e} on disk" for e in ENGINE_ORDER) + " |")
    L.append("|---|" + "---|---|" * len(ENGINE_ORDER))
    for key, r in res["models"].items():
        cells = []
        for e in ENGINE_ORDER:
            if e in r["footprint"]:
                cells += [_mb(r["footprint"][e]), _mb(r["artifact_bytes"][e])]
            else:
                cells += ["-", "-"]
        L.append(f"| {key} | " + " | ".join(cells) + " |")
    L.append("")
    L.append("## Targets")
    L.append("")
    L.append("| target | measured | goal | met |")
    L.append("|---|---|---|---|")
    for t in res["targets"]:
        v = t["value"]
        unit = "x" if "x" in t["goal"] else " us"
        L.append(f"| {t['target']} | {v:.2f}{unit} | {t['goal']} | "
                 f"{'yes' if t['met'] else '**no**'} |")
    L.append("")
    L += v2_section(res)
    if charts:
        L.append("## Charts")
        L.append("")
        for c in charts:
            L.append(f"![{c.stem}]({c.name})")
        L.append("")
    # the narrative (what the figures mean, what was tried) is NOTES.md: linked, not copied
    L.append("What these figures mean and what was tried on the way: [NOTES.md](NOTES.md).")
    L.append("")
    (out / f"RESULTS{suffix}.md").write_text("\n".join(L))


def charts_png(res, out: Path, suffix: str) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    keys = list(res["models"])
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, k in zip(axes, ("1", "2"), strict=True):
        width = 0.2
        for i, e in enumerate(ENGINE_ORDER):
            xs, ys = [], []
            for j, key in enumerate(keys):
                tp = res["models"][key]["throughput"]
                if e in tp:
                    xs.append(j + (i - 1.5) * width)
                    ys.append(tp[e][k]["rows_per_s"])
            ax.bar(xs, ys, width, label=e, color=COLORS[e])
        ax.set_yscale("log")
        ax.set_xticks(range(len(keys)), keys)
        ax.set_title(f"batch throughput, {k} thread{'s' if k == '2' else ''}")
        ax.set_ylabel("rows/s (log)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    paths.append(out / f"throughput{suffix}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in keys:
        sc = res["models"][key]["scaling"]
        ns = sorted(int(n) for n in sc)
        ax.plot(ns, [scaling_speedup(sc[str(n)]) for n in ns], marker="o", label=key)
    ax.axhline(1.8, color="grey", ls="--", lw=1, label="target 1.8x")
    ax.axhline(2.0, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("batch rows")
    ax.set_ylabel("2-thread / 1-thread rows/s")
    ax.set_title("ours: thread scaling")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / f"scaling{suffix}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 4))
    labels, p50, p99, cols = [], [], [], []
    for key in keys:
        r = res["models"][key]
        if r.get("latency_native"):
            labels.append(f"{key}\nours (C)")
            p50.append(r["latency_native"]["p50"])
            p99.append(r["latency_native"]["p99"])
            cols.append("#5aae61")
        for e in ENGINE_ORDER:
            if e in r["latency_py"]:
                labels.append(f"{key}\n{e}")
                p50.append(r["latency_py"][e]["p50"])
                p99.append(r["latency_py"][e]["p99"])
                cols.append(COLORS[e])
    xs = range(len(labels))
    ax.bar(xs, p99, 0.8, color=cols, alpha=0.35, label="p99")
    ax.bar(xs, p50, 0.8, color=cols, label="p50")
    ax.set_yscale("log")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("microseconds (log)")
    ax.set_title("single-row latency (solid p50, light p99); 'ours (C)' timed inside native code")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    paths.append(out / f"latency{suffix}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
