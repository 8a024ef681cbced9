"""Lazy stopping policies: load-time tables, parameters, results, audit.

The stopping itself runs in the nogil block kernel (cyext/lazy.pyx). This module

* builds the per-model tables once (cached on its ``Target``): per work unit and output the suffix
  sums of the remaining trees' minimum and maximum leaves (the certified interval), LazyGBM's
  residual capacities R_t and V_t, and LazyRF's exact binary tails;
* turns score-space decision thresholds into raw-space cuts, checked against numpy's own link
  functions (the ones ``score_batch`` uses), so a settled interval means a settled band;
* states every rule as a small pure function (``rf_binary_tail``, ``rf_posterior``,
  ``gbm_rule``, ``certified_settled``): the reference the kernel is tested against;
* maps raw results to ``ScoreResult`` and selects the audit's rows (``audit_mask``; the
  audit itself, a full evaluation of them, is ``CompiledModel``'s).

Why ``certified`` never changes a band (the proof the tests exercise): after u units the full
raw score is partial + (remaining trees), each remaining tree adds a value in [its min leaf, its
max leaf], so the exact sum lies in [partial + smin_u, partial + smax_u]. The kernel's rounded
sum differs from the exact one by at most half an ulp per addition of a partial sum bounded by
|partial| + sabs_u; ``bounds_at`` (lazy.pyx) widens by (nrem + 4)(eps (|partial| + sabs) +
1e-44) with eps = 2^-23 + 2^-51 (float32 models) or 2^-51 (float64), at least twice the unit
roundoffs, which also covers the float64 rounding of the suffix sums. Division by the forest's
divisor is monotone. The score is a nondecreasing function of the raw score (binary and
regression links) and the band of a score is nondecreasing in it, so if the whole interval lies
at or below a raw value a with band(f(a)) = k, or at or above b with band(f(b)) = k, every raw
score in it, the full one included, has band k; a and b are found and verified with numpy's own
link (assumption: numpy's sigmoid/exp are nondecreasing, as correctly rounded or faithful
implementations of monotone functions are; we widen by a further 1e-12 relative). Multiclass:
the leader's lower bound beats every other class's upper bound by 1e-9 (1 + |hi|), so the full
argmax is the leader even through numpy's rounding, and the leader's softmax probability is
bounded by putting it at its low end and the others at their high end (and vice versa); those
probability bounds must clear each threshold by 1e-9 (far above libm/numpy rounding).

What a stopped row reports (rows that ran every unit report exactly what ``lazy="off"`` does):

* ``certified``: score from the midpoint of the raw interval (inside the settled band), label
  and decision equal to full evaluation, stop_reason ``certificate``.
* ``lazyrf``: the soft vote of the trees evaluated so far (the stopping rule itself uses hard
  votes, as the paper does), stop_reason ``posterior``.
* ``lazygbm``: the link of the partial margin, stop_reason ``certificate``/``flip``/``late``.
  Labels follow the model's own convention (a margin of exactly 0 is class 0, as XGBoost and
  scikit-learn predict), not the paper's "F = 0 predicts positive".
* every policy: ``score_lo``/``score_hi`` are guaranteed bounds of the full-model score, from
  the same suffix interval, widened by 1e-13 relative for link rounding.

``work_units`` counts the units whose trees were walked: ``certified`` checks every ``chunk``
units (default: about 8 trees), ``lazyrf`` every ``block`` trees, ``lazygbm`` every round.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import _lazy
from .result import ScoreResult, decisions, default_threads

# the kernel's codes, by the names the API uses
POLICIES = {p.name.removeprefix("POLICY_").lower(): int(p) for p in _lazy.Policy}
VARIANTS = {v.name.removeprefix("GBM_").lower(): int(v) for v in _lazy.GbmVariant}
BAND_SINGLE, BAND_VOTE, BAND_SOFTMAX = (int(_lazy.Band.BAND_SINGLE), int(_lazy.Band.BAND_VOTE),
                                        int(_lazy.Band.BAND_SOFTMAX))
CLS_MARGIN = 1e-9  # multiclass leader margin (relative) and softmax-probability cut margin
# certified: check after about this many trees. 16 (the wide walk) measured 1.29x full speed
# on the demo XGBoost model against 1.02x for 8 (63.5% -> 66.5% of the work): a check costs
# about as much as walking 8 trees for a row
DEFAULT_CHUNK_TREES = 16

_PARAMS = {
    "certified": {"chunk"},
    "lazyrf": {"tau", "block", "t_min", "mc_samples", "seed"},
    "lazygbm": {"spr_threshold", "t_min", "late_fraction", "variant", "flip_scale"},
}
_COMMON = {"audit_fraction", "audit_seed"}


@dataclass(frozen=True, eq=False)
class Target:
    """What the stopping policies read of a model, and no more: the forest the kernel walks,
    the packed arrays the tables come from, the model's shape and link, and the link from raw
    scores to (score, label index). ``CompiledModel.lazy_target`` builds it once; this module
    never sees the ``CompiledModel`` (it calls here, not the other way)."""

    forest: object  # _kernels.Forest
    arrays: dict
    link: str
    task: str
    kind: str
    n_outputs: int
    n_classes: int
    n_trees: int
    work_total: int
    score_from_raw: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    cache: dict = field(default_factory=dict)  # tables built once (tables, cuts, rf tails)


# ---- load-time tables ---------------------------------------------------------------------

@dataclass(frozen=True)
class LazyTables:
    """Per work unit u (0..n_units) and output g: what the trees after unit u can still add."""

    unit_ptr: np.ndarray  # int64 (U + 1,)
    smin: np.ndarray  # float64 (U + 1, G): sum of remaining minimum leaves (accumulator units)
    smax: np.ndarray  # float64 (U + 1, G): sum of remaining maximum leaves
    nrem: np.ndarray  # float64 (U + 1, G): remaining trees adding to output g
    sabs: np.ndarray  # float64 (U + 1, G): sum of remaining max |leaf|
    eps: float  # relative rounding slack per remaining addition (see module docstring)
    R: np.ndarray  # float64 (U + 1,): R_t = sum_{s > t} w_s
    V: np.ndarray  # float64 (U + 1,): V_t = sum_{s > t} w_s^2


def _suffix(per_tree: np.ndarray, unit_ptr: np.ndarray) -> np.ndarray:
    """Sum over trees t >= unit_ptr[u] for every u (float64, summed from the back)."""
    n = per_tree.shape[0]
    suf = np.zeros((n + 1,) + per_tree.shape[1:], dtype=np.float64)
    suf[:n] = np.cumsum(per_tree[::-1], axis=0)[::-1]
    return np.ascontiguousarray(suf[unit_ptr])


def tables(target: Target) -> LazyTables:
    """Built once per model and cached on it."""
    cached = target.cache.get("tables")
    if cached is not None:
        return cached
    a = target.arrays
    acc = a["leaves"].dtype
    group = a["tree_group"].astype(np.int64)
    unit_ptr = a["unit_ptr"].astype(np.int64)
    G = int(target.n_outputs)
    # the values the kernel really adds: the leaves rounded to the accumulator type
    lmin = a["leaf_min"].astype(acc).astype(np.float64)
    lmax = a["leaf_max"].astype(acc).astype(np.float64)
    n_trees = group.shape[0]
    cmin = np.zeros((n_trees, G))
    cmax = np.zeros((n_trees, G))
    cnt = np.zeros((n_trees, G))
    single = group >= 0
    rows = np.flatnonzero(single)
    cmin[rows, group[single]] = lmin[single, 0]
    cmax[rows, group[single]] = lmax[single, 0]
    cnt[rows, group[single]] = 1.0
    cmin[~single] = lmin[~single, :G]
    cmax[~single] = lmax[~single, :G]
    cnt[~single] = 1.0
    cabs = np.maximum(np.abs(cmin), np.abs(cmax))
    eps = 2.0**-51 + (2.0**-23 if acc == np.float32 else 0.0)
    tree_abs = np.maximum(np.abs(lmin), np.abs(lmax)).max(axis=1)
    n_units = unit_ptr.shape[0] - 1
    w = np.array([tree_abs[unit_ptr[u]:unit_ptr[u + 1]].max(initial=0.0)
                  for u in range(n_units)])
    R = np.zeros(n_units + 1)
    V = np.zeros(n_units + 1)
    R[:n_units] = np.cumsum(w[::-1])[::-1]
    V[:n_units] = np.cumsum((w**2)[::-1])[::-1]
    t = LazyTables(unit_ptr, _suffix(cmin, unit_ptr), _suffix(cmax, unit_ptr),
                   _suffix(cnt, unit_ptr), _suffix(cabs, unit_ptr), eps, R, V)
    target.cache["tables"] = t
    return t


def rf_binary_tail(t: int) -> np.ndarray:
    """P(Binomial(t + 1, 1/2) <= n) for n = 0..t, from exact integer sums (correctly rounded)."""
    total = 1 << (t + 1)
    out = np.empty(t + 1)
    cum = 0
    for n in range(t + 1):
        cum += math.comb(t + 1, n)
        out[n] = cum / total  # int / int: correctly rounded
    return out


def rf_tail_table(target: Target, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Binary tails at every checkpoint t = block, 2 block, ... (cached per block size)."""
    cache = target.cache.setdefault("rf_tails", {})
    if block not in cache:
        ts = range(block, target.work_total + 1, block)
        parts = [rf_binary_tail(t) for t in ts] or [np.zeros(0)]
        off = np.cumsum([0] + [p.shape[0] for p in parts])[:-1].astype(np.int64)
        cache[block] = (np.concatenate(parts), off)
    return cache[block]


# ---- the rules as pure functions (the reference the kernel is tested against) ------------

def rf_votes_leader(votes: np.ndarray) -> tuple[int, int]:
    """Leader (argmax, lowest index on ties) and runner-up among the others."""
    votes = np.asarray(votes)
    lead = int(np.argmax(votes))
    rest = votes.astype(np.float64).copy()
    rest[lead] = -np.inf
    return lead, int(np.argmax(rest))


def rf_posterior(votes, t: int, mc_samples: int | None = None, seed: int = 0) -> float:
    """LazyRF posterior dominance score of the leader after t trees with hard votes `votes`."""
    votes = np.asarray(votes, dtype=np.int64)
    K = votes.shape[0]
    lead, run = rf_votes_leader(votes)
    if K == 2:
        return float(rf_binary_tail(t)[votes[lead]])
    A = t + K
    if A < 30:
        S = mc_samples or max(256, 32 * K)
        return float(_lazy.lazy_mc_score(votes, lead, S, seed))
    a1, a2 = 1.0 + votes[lead], 1.0 + votes[run]
    mu = (a1 - a2) / A
    var = (a1 * (A - a1) + a2 * (A - a2) + 2 * a1 * a2) / (A * A * (A + 1.0))
    z = mu / (math.sqrt(var) + 1e-12)
    return 0.5 * (1.0 + math.tanh(0.7978845608 * (z + 0.044715 * z**3)))


def rf_stop(votes, t: int, tau: float = 0.95, t_min: int = 10, **kw) -> bool:
    return t >= t_min and rf_posterior(votes, t, **kw) > tau


def gbm_rule(raw, t: int, R: float, V: float, *, n_units: int, variant: str = "prototype",
             spr_threshold: float = 3.0, t_min: int = 10, late_fraction: float = 0.8,
             flip_scale: float | None = None) -> str | None:
    """LazyGBM after t rounds with class scores `raw`: the stop reason, or None."""
    raw = np.asarray(raw, dtype=np.float64).reshape(-1)
    binary = raw.shape[0] == 1
    if binary:
        m = float(raw[0])
        if abs(m) > R:
            return "certificate"
    else:
        top = np.sort(raw)[::-1]
        m = float(top[0] - top[1])
        if m > 2 * R or m / (2 * R + 1e-9) > 1.5:
            return "certificate"
    if variant != "certificate_only" and t >= t_min:
        c = flip_scale if flip_scale is not None else (1.0 if binary else 2.0)
        if V == 0.0 or math.exp(-m * m / (2 * (V + 1e-12))) < c * math.exp(-spr_threshold):
            return "flip"
    if variant == "prototype" and not binary and t > math.floor(late_fraction * n_units) \
            and m > 0:
        return "late"
    return None


def certified_settled(lo, hi, cut_a, cut_b, band_mode: int) -> bool:
    """The kernel's certificate on raw bounds lo/hi (1-D, one per output)."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)

    def settled(vlo, vhi):
        return all(vhi <= a or vlo >= b for a, b in zip(cut_a, cut_b, strict=True))

    if lo.shape[0] == 1:
        return settled(lo[0], hi[0])
    L = int(np.argmax(lo))
    others = np.arange(lo.shape[0]) != L
    margin = CLS_MARGIN if band_mode == BAND_SOFTMAX else 0.0
    if not np.all(lo[L] > hi[others] + margin * (1 + np.abs(hi[others]))):
        return False
    if band_mode == BAND_VOTE:
        return settled(lo[L], hi[L])
    p_lo = 1 / (1 + np.exp(hi[others] - lo[L]).sum())
    p_hi = 1 / (1 + np.exp(lo[others] - hi[L]).sum())
    return settled(p_lo, p_hi)


# ---- thresholds -> cuts ------------------------------------------------------------------

def _step_cut(g, guess: float) -> tuple[float, float]:
    """For a nondecreasing 0/1 function g of the raw score (numpy's own arithmetic): a with
    g(a) = 0 and b with g(b) = 1, both near the switch point (a = b = +-inf if g is constant)."""
    with np.errstate(all="ignore"):
        big = 1e300
        if g(-big):
            return -np.inf, -np.inf
        if not g(big):
            return np.inf, np.inf
        lo, hi = (guess, guess) if np.isfinite(guess) else (0.0, 0.0)
        step = 1e-9 * (1.0 + abs(lo))
        while g(lo):
            lo -= step
            step *= 4
        step = 1e-9 * (1.0 + abs(hi))
        while not g(hi):
            hi += step
            step *= 4
        for _ in range(200):  # bisect to adjacent doubles (or close)
            mid = lo + (hi - lo) / 2
            if mid <= lo or mid >= hi:
                break
            if g(mid):
                hi = mid
            else:
                lo = mid
        a = lo - 1e-12 * (1.0 + abs(lo))
        b = hi + 1e-12 * (1.0 + abs(hi))
        if g(a) or not g(b):  # numpy's link is not monotone here: give up certifying this cut
            return -np.inf, np.inf
        return a, b


def cuts(target: Target, thresholds) -> tuple[np.ndarray, np.ndarray, int]:
    """Raw-space (or, for softmax, probability-space) cuts and the band mode for `certified`."""
    thr = np.sort(np.asarray(list(thresholds), dtype=np.float64))
    if target.n_outputs > 1:
        if target.link == "vote":  # the score is the leader's raw value itself
            return np.nextafter(thr, -np.inf), thr.copy(), BAND_VOTE
        return thr - CLS_MARGIN, thr + CLS_MARGIN, BAND_SOFTMAX

    def score(r):
        return target.score_from_raw(np.array([[r]], dtype=np.float64))[0][0]

    def inverse(t):
        if target.link in ("sigmoid", "sigmoid2"):
            p = min(max(t, 1e-300), 1 - 1e-16)
            z = math.log(p / (1 - p))
            return z / 2 if target.link == "sigmoid2" else z
        return t

    a, b = [], []
    for t in thr:
        ca, cb = _step_cut(lambda r, t=t: bool(score(r) >= t), inverse(t))
        a.append(ca)
        b.append(cb)
    if target.task != "regression":  # the label must not change either
        ca, cb = _step_cut(
            lambda r: bool(target.score_from_raw(np.array([[r]], dtype=np.float64))[1][0]),
            inverse(0.5))
        a.append(ca)
        b.append(cb)
    return np.asarray(a), np.asarray(b), BAND_SINGLE


def cached_cuts(target: Target, thresholds):
    key = tuple(float(t) for t in thresholds)
    cache = target.cache.setdefault("cuts", {})
    if key not in cache:
        cache[key] = cuts(target, key)
    return cache[key]


# ---- configuration -----------------------------------------------------------------------

def kernel_config(target: Target, lazy: str, thresholds, params: dict
                  ) -> _lazy.KernelConfig:
    if lazy not in POLICIES:
        raise ValueError(f"lazy must be one of off, {', '.join(POLICIES)}; got {lazy!r}")
    unknown = set(params) - _PARAMS[lazy] - _COMMON
    if unknown:
        raise TypeError(f"unknown parameter(s) for lazy={lazy!r}: {', '.join(sorted(unknown))}")
    tb = tables(target)
    n_units = target.work_total
    empty, empty_i = np.zeros(0), np.zeros(0, dtype=np.int64)
    cfg = dict(policy=POLICIES[lazy], unit_ptr=tb.unit_ptr, smin=tb.smin, smax=tb.smax,
               nrem=tb.nrem, sabs=tb.sabs, eps=tb.eps, band_mode=BAND_SINGLE, cut_a=empty,
               cut_b=empty, cls_margin=0.0, n_vote=0, t_min=0, tau=1.0, tail=empty,
               tail_off=empty_i, mc_samples=1, seed=0, R=tb.R, V=tb.V, flip_bound=0.0,
               variant=0, late_t=n_units)
    if lazy == "certified":
        a, b, mode = cached_cuts(target, thresholds)
        per_unit = max(1, target.n_trees // max(n_units, 1))
        chunk = int(params.get("chunk", max(1, DEFAULT_CHUNK_TREES // per_unit)))
        cfg.update(step=chunk, cut_a=a, cut_b=b, band_mode=mode,
                   cls_margin=CLS_MARGIN if mode == BAND_SOFTMAX else 0.0)
    elif lazy == "lazyrf":
        if target.link != "vote" or target.task == "regression":
            raise ValueError("lazyrf is for soft-voting forest classifiers (RandomForest, "
                             f"ExtraTrees); this model is {target.kind} ({target.task})")
        block = int(params.get("block", 10))
        K = max(2, target.n_classes)
        tail, off = rf_tail_table(target, block) if K == 2 else (empty, empty_i)
        cfg.update(step=block, n_vote=K, t_min=int(params.get("t_min", 10)),
                   tau=float(params.get("tau", 0.95)), tail=tail, tail_off=off,
                   mc_samples=int(params.get("mc_samples", max(256, 32 * K))),
                   seed=int(params.get("seed", 0)))
    else:
        if target.link == "vote" or target.task == "regression":
            raise ValueError("lazygbm is for boosted classifiers (XGBoost, GradientBoosting, "
                             f"HistGradientBoosting); this model is {target.kind} ({target.task})")
        variant = params.get("variant", "prototype")
        if variant not in VARIANTS:
            raise ValueError(f"lazygbm variant must be one of {', '.join(VARIANTS)}")
        binary = target.n_outputs == 1
        scale = params.get("flip_scale")
        scale = float(scale) if scale is not None else (1.0 if binary else 2.0)
        cfg.update(step=1, t_min=int(params.get("t_min", 10)), variant=VARIANTS[variant],
                   flip_bound=scale * math.exp(-float(params.get("spr_threshold", 3.0))),
                   late_t=math.floor(float(params.get("late_fraction", 0.8)) * n_units))
    return _lazy.KernelConfig(**cfg)


# ---- results -----------------------------------------------------------------------------

def _widen(lo: np.ndarray, hi: np.ndarray, prob: bool):
    """Outward by 1e-13 relative (+1e-300): the rounding of the link at both ends of the
    interval and of the full score's own link (libm/numpy exp, a K-term sum: a few ulps each)."""
    lo = lo - (np.abs(lo) * 1e-13 + 1e-300)
    hi = hi + (np.abs(hi) * 1e-13 + 1e-300)
    if prob:
        np.clip(lo, 0.0, 1.0, out=lo)
        np.clip(hi, 0.0, 1.0, out=hi)
    return lo, hi


def score_bounds(target: Target, raw_lo: np.ndarray, raw_hi: np.ndarray) -> tuple:
    """Bounds of the full-model score (the output `score`: max class probability) from raw
    bounds."""
    if target.n_outputs == 1:
        return target.score_from_raw(raw_lo)[0], target.score_from_raw(raw_hi)[0]
    if target.link == "vote":  # score = max class probability = max raw
        return raw_lo.max(axis=1), raw_hi.max(axis=1)
    n, G = raw_lo.shape
    rows = np.arange(n)
    with np.errstate(over="ignore"):
        # lower: any class's lower bound bounds the max; take the class with the best low end
        k = raw_lo.argmax(axis=1)
        e = np.exp(raw_hi - raw_lo[rows, k][:, None])
        e[rows, k] = 0.0
        p_lo = 1 / (1 + e.sum(axis=1))
        # upper: only classes whose high end reaches the best low end can be the full argmax
        p_hi = np.zeros(n)
        cand = raw_hi >= raw_lo.max(axis=1, keepdims=True)
        for c in range(G):
            r = np.flatnonzero(cand[:, c])
            if r.size:
                e = np.exp(raw_lo[r] - raw_hi[r, c][:, None])
                e[:, c] = 0.0
                p_hi[r] = np.maximum(p_hi[r], 1 / (1 + e.sum(axis=1)))
    return p_lo, p_hi


def audit_mask(n: int, fraction: float, seed: int = 0) -> np.ndarray:
    """Deterministic row selection: splitmix64 of (seed + row index + 1) / 2^64 < fraction.

    Callers scoring a stream pass the number of rows before this batch as ``seed``, so the
    selection is a hash of each row's position in the stream (row 0 of a batch is not special).
    """
    if fraction <= 0 or n == 0:
        return np.zeros(n, dtype=bool)
    with np.errstate(over="ignore"):
        z = (np.arange(n, dtype=np.uint64) + np.uint64((seed + 1) & (2**64 - 1))) * np.uint64(
            0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53 < fraction


def score_lazy(target: Target, cols, lazy: str, thresholds=(0.5,), n_threads=None,
               **params) -> ScoreResult:
    """The scores of the gathered rows ``cols`` (``_kernels.Columns``, or a float32 row block)
    under a stopping policy: ``CompiledModel.score_batch`` for every policy but ``off``."""
    thresholds = list(thresholds)
    if target.link == "probit":  # the bounds argument needs a link proven nondecreasing
        raise ValueError("lazy policies do not apply to ONNX Runtime's PROBIT transform (an "
                         "approximation not proven nondecreasing): use lazy off")
    if target.forest.aggregate != "sum":  # the bounds argument is a sum's
        raise ValueError(f"lazy policies do not apply to aggregate {target.forest.aggregate} "
                         "(ONNX MIN / MAX: the bounds assume the trees are added): use lazy "
                         "off")
    if target.link == "softmax_zero":  # the bounds argument is the softmax's
        raise ValueError("lazy policies do not apply to ONNX Runtime's SOFTMAX_ZERO "
                         "transform (its probabilities are not the softmax the bounds "
                         "assume): use lazy off")
    cfg = kernel_config(target, lazy, thresholds, params)
    raw, raw_lo, raw_hi, units, reason = _lazy.lazy_score(
        target.forest, cols, cfg, int(n_threads or default_threads()))
    score, label = target.score_from_raw(raw)
    stopped = reason != 0
    lo, hi = score.copy(), score.copy()  # every unit ran: the bounds are the score itself
    if stopped.any():
        s_lo, s_hi = score_bounds(target, raw_lo[stopped], raw_hi[stopped])
        # a probability from a link lies in [0, 1]; a vote summed in float32 (an ONNX
        # forest: 1.0000003576 seen) may pass 1, and a bound clipped there would not hold it
        prob = target.task != "regression" and target.link not in ("identity", "vote")
        lo[stopped], hi[stopped] = _widen(s_lo, s_hi, prob)
    if lazy == "certified":  # the midpoint is inside the bounds up to link rounding
        score = np.where(stopped, np.clip(score, lo, hi), score)
    return ScoreResult(
        score=score,
        label=label,
        decision=decisions(score, thresholds),
        work_units=units,
        stop_code=np.asarray(reason, dtype=np.int8),
        score_lo=lo,
        score_hi=hi,
    )
