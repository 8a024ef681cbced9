"""The layout and kernel a model is scored with, chosen at compile time by measurement.

Every candidate the model allows (the padded layout where its trees are shallow enough, the
compact layout always; under each the tree walks, and QuickScorer where its trees have at most
64 leaves) is built and timed on the same probe rows, alternating candidates so a slow moment of
the machine falls on all of them. The default (padded up to depth ``pack.MAX_PADDED_DEPTH``, the
walks) is kept unless another candidate is at least ``MARGIN`` faster, the layout decided
before the kernel (``choose``), so a model does not change layout from one compile to the next
on noise. Every candidate gives the same scores bit
for bit: the choice changes speed only. The choice and every candidate's timing go into the
artifact's header (``meta.layout_choice``, outside the model id: ``artifact.MEASURED``).
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np

from . import pack
from .ir import Ensemble

MARGIN = 0.15  # another candidate is taken only if at least this much faster than the default
PROBE_DEPTH = 12  # the padded layout is a candidate up to this depth ...
PROBE_PADDED_BYTES = 64 << 20  # ... and this size of padded nodes and leaves
PROBE_ROWS = 2048  # per probe set (one without missing values, one with 5% missing)
ROUNDS = 7  # timed rounds per candidate (median), candidates alternated within a round
ROUND_SECONDS = 0.003  # at least this long per candidate per round


def name(layout: str, kernel: str) -> str:
    return f"{layout} {kernel}"


def padded_bytes(ens: Ensemble, depth: int) -> int:
    """The padded layout's node and leaf bytes: trees completed to ``depth``."""
    width = ens.trees[0].value.shape[1] if ens.trees else 1
    leaf = 4 if ens.accumulate == "float32" else 8
    return ens.n_trees * (((1 << depth) - 1) * 8 + (1 << depth) * width * leaf)


def layouts(ens: Ensemble, layout: str) -> list[str]:
    """The layouts to time: the forced one, or those the model allows."""
    if layout != "auto":
        return [layout]
    depth = max((t.depth() for t in ens.trees), default=0)
    padded = depth <= PROBE_DEPTH and padded_bytes(ens, depth) <= PROBE_PADDED_BYTES
    return (["padded"] if padded else []) + ["compact"]


def default(ens: Ensemble, layout: str) -> tuple[str, str]:
    """What is taken unless a candidate measures ``MARGIN`` faster: the packer's rule."""
    if layout == "auto":
        depth = max((t.depth() for t in ens.trees), default=0)
        layout = "padded" if depth <= pack.MAX_PADDED_DEPTH else "compact"
    return layout, "walk"


def probe_rows(ens: Ensemble, n: int = PROBE_ROWS, seed: int = 0) -> np.ndarray:
    """Rows that take every branch: each feature's values drawn from the model's own
    thresholds (on them or one float32 step either side) or evenly over their range and a
    little beyond; a feature only categorical splits
    read takes small category codes; a feature no split reads is 0. Two halves: without
    missing values, and with 5% of values missing."""
    rng = np.random.default_rng(seed)
    nf = ens.n_features
    thresholds: list[list[np.ndarray]] = [[] for _ in range(nf)]
    special = np.zeros(nf, dtype=bool)
    for t in ens.trees:
        inner = np.flatnonzero(t.feature >= 0)
        plain = np.asarray([i for i in inner if int(i) not in t.special], dtype=np.int64)
        for i in t.special:
            special[t.feature[i]] = True
        if plain.size:
            f, thr = t.feature[plain], t.threshold[plain].astype(np.float32)
            for feat in np.unique(f):
                thresholds[feat].append(thr[f == feat])
    X = np.zeros((2 * n, max(nf, 1)), dtype=np.float32)
    for f in range(nf):
        if thresholds[f]:
            thr = np.concatenate(thresholds[f])
            thr = thr[np.isfinite(thr)]
        else:
            thr = np.empty(0, dtype=np.float32)
        if thr.size:
            v = thr[rng.integers(0, thr.size, 2 * n)]
            step = rng.integers(-1, 2, 2 * n)
            with np.errstate(over="ignore"):  # a threshold at +-FLT_MAX steps to +-inf
                v = np.where(step < 0, np.nextafter(v, np.float32(-np.inf)),
                             np.where(step > 0, np.nextafter(v, np.float32(np.inf)), v))
            # half the rows anywhere in the thresholds' range and an eighth of it beyond
            lo, hi = float(thr.min()), float(thr.max())
            pad = (hi - lo) / 8 or 1.0
            big = float(np.finfo(np.float32).max)
            spread = np.clip(rng.uniform(lo - pad, hi + pad, 2 * n), -big, big).astype(
                np.float32)
            X[:, f] = np.where(rng.random(2 * n) < 0.5, v, spread)
        elif special[f]:
            X[:, f] = rng.integers(0, 32, 2 * n).astype(np.float32)
    X[n:][rng.random((n, X.shape[1])) < 0.05] = np.nan
    return X[:, :nf] if nf else X


def measure(models: dict[str, object], X: np.ndarray, rounds: int = ROUNDS,
            least_s: float = ROUND_SECONDS) -> dict[str, float]:
    """Microseconds per row, 1 thread, median over ``rounds`` alternated rounds; in a round
    each candidate scores the probe rows as many times as fill ``least_s`` (counted on an
    untimed warm-up), so a fast model's timing is not one short call's noise."""
    times: dict[str, list[float]] = {k: [] for k in models}
    reps = {}
    for k, m in models.items():
        t0 = time.perf_counter()
        m.raw(X, n_threads=1)
        reps[k] = max(1, int(least_s / max(time.perf_counter() - t0, 1e-6)))
    for _ in range(rounds):
        for k, m in models.items():
            t0 = time.perf_counter()
            for _ in range(reps[k]):
                m.raw(X, n_threads=1)
            times[k].append((time.perf_counter() - t0) / (reps[k] * X.shape[0]) * 1e6)
    return {k: round(float(np.median(v)), 4) for k, v in times.items()}


def choose(timings: dict[str, float], fallback: str) -> str:
    """``fallback`` unless a candidate beats it by ``MARGIN``; then the layout before the
    kernel: ``fallback``'s layout unless the other's fastest candidate beats every candidate
    under it by ``MARGIN`` too, and the fastest kernel under the layout taken. The same kernel
    under both layouts times about the same, so a near tie stays in the default layout and the
    model (whose id covers its layout; the kernel it does not) does not change from one compile
    to the next on noise."""
    best = min(timings, key=timings.__getitem__)
    if fallback in timings and timings[best] > (1 - MARGIN) * timings[fallback]:
        return fallback
    home_layout = fallback.split(" ")[0]
    home = {k: t for k, t in timings.items() if k.split(" ")[0] == home_layout}
    if home and timings[best] > (1 - MARGIN) * min(home.values()):
        return min(home, key=home.__getitem__)
    return best


def machine() -> str:
    """The CPU the timings were taken on (model name and count)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs"
