"""Lazy stopping policies: `certified` never changes a band; the paper's rules stop when they
should (hand-computed cases and a slow Python reference on real models)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import worker
from tests import models as M
from worker import _kernels, _lazy
from worker.model import lazy as L
from worker.model import pack
from worker.model.compile import meta_of
from worker.model.compiled import CompiledModel
from worker.model.ir import Ensemble, Tree

ROWS = [1, 63, 64, 65, 200]
NAN_REJECTED = {"gb-binary", "gb-multi", "gb-exponential", "gb-reg"}
CERT_MODELS = [
    "xgb-binary-logistic", "xgb-binary-logitraw", "xgb-reg-squarederror", "xgb-reg-logistic",
    "xgb-multi-softprob", "xgb-parallel-tree", "xgb-deep", "rf-binary", "rf-multi", "et-reg",
    "gb-binary", "gb-multi", "gb-exponential", "hgb-binary", "hgb-multi", "hgb-reg"]

_CACHE: dict = {}


def source(name):
    return {**M.xgboost_models(), **M.sklearn_models()}[name]


def compiled(name, layout="auto"):
    if (name, layout) not in _CACHE:
        _CACHE[name, layout] = worker.compile_model(source(name), layout=layout)
    return _CACHE[name, layout]


def rows_for(name, n, seed):
    src = source(name)
    thr = M.xgboost_thresholds(src) if name.startswith("xgb") else M.sklearn_thresholds(src)
    X = M.hostile_rows(n, thr, seed=seed, nan=name not in NAN_REJECTED)
    return X


# ---- a slow reference: every tree's exact contribution, prefix sums in the model's precision --

def tree_contributions(model: CompiledModel, X) -> np.ndarray:
    """(n_trees, n, G): what each tree adds to each output (exact leaf values)."""
    a = model.arrays
    depth = int(model.depth)
    out = []
    for t in range(model.n_trees):
        sub = {"tree_group": a["tree_group"][t:t + 1], "tree_depth": a["tree_depth"][t:t + 1],
               "base": np.zeros_like(a["base"])}
        if model.layout == "padded":
            ni = (1 << depth) - 1
            sub["pnodes"] = a["pnodes"][t * ni:(t + 1) * ni]
            sub["leaves"] = a["leaves"][t << depth:(t + 1) << depth]
        else:
            sub["cnodes"], sub["leaves"] = a["cnodes"], a["leaves"]
            sub["root"] = a["root"][t:t + 1]
        f = _kernels.Forest(sub, model.layout, depth, model.n_features, model.n_outputs, 1.0)
        out.append(f.raw(_kernels.Columns.from_numpy(X)))
    return np.stack(out)


def prefix_acc(model: CompiledModel, contrib: np.ndarray) -> np.ndarray:
    """(n_units + 1, n, G) accumulators after each unit, added in the kernel's own precision."""
    dt = model.arrays["leaves"].dtype
    acc = np.broadcast_to(model.arrays["base"].astype(dt), contrib.shape[1:]).copy()
    up = model.arrays["unit_ptr"]
    out = [acc.astype(np.float64)]
    for u in range(model.work_total):
        for t in range(up[u], up[u + 1]):
            acc = (acc + contrib[t].astype(dt)).astype(dt)
        out.append(acc.astype(np.float64))
    return np.stack(out)


def ref_bounds(model, tb, u, a):
    e = (tb.nrem[u] + 4.0) * (tb.eps * (np.abs(a) + tb.sabs[u]) + 1e-44)
    return (a + tb.smin[u] - e) / model.divisor, (a + tb.smax[u] + e) / model.divisor


def reference(model: CompiledModel, X, lazy, thresholds=(0.5,), **params):
    """(work_units, stop_reason, raw) per row from the pure-Python rules in worker.model.lazy."""
    cfg = L.kernel_config(model.lazy_target, lazy, thresholds, params)
    tb = L.tables(model.lazy_target)
    contrib = tree_contributions(model, X)
    pre = prefix_acc(model, contrib)
    U, n = model.work_total, X.shape[0]
    units = np.full(n, U, dtype=np.int32)
    reasons = np.full(n, "full", dtype=object)
    raw = pre[U] / model.divisor
    for i in range(n):
        if lazy == "certified":
            checks = [0, *range(cfg.step, U, cfg.step)]
        elif lazy == "lazyrf":
            checks = range(cfg.step, U, cfg.step)
        else:
            checks = range(1, U)
        votes = np.zeros(max(2, model.n_classes), dtype=np.int64)
        last = 0
        for u in checks:
            if lazy == "lazyrf":
                for t in range(last, u):
                    c = contrib[t, i]
                    votes[int(c[0] > 0.5) if c.shape[0] == 1 else int(np.argmax(c))] += 1
                last = u
                why = "posterior" if L.rf_stop(votes, u, tau=cfg.tau, t_min=cfg.t_min,
                                               mc_samples=cfg.mc_samples,
                                               seed=cfg.seed) else None
            elif lazy == "lazygbm":
                why = L.gbm_rule(pre[u, i], u, tb.R[u], tb.V[u], n_units=U,
                                 **{k: v for k, v in params.items() if k != "audit_fraction"})
            else:
                lo, hi = ref_bounds(model, tb, u, pre[u, i])
                why = "certificate" if L.certified_settled(lo, hi, cfg.cut_a, cfg.cut_b,
                                                           cfg.band_mode) else None
            if why:
                units[i], reasons[i] = u, why
                break
    return units, reasons, raw


# ---- certified: never changes a band, bounds always hold --------------------------------------

def check_certified(model, X, thresholds, n_threads=1, **params):
    off = model.score_batch(X, thresholds=thresholds, n_threads=n_threads)
    r = model.score_batch(X, lazy="certified", thresholds=thresholds, n_threads=n_threads,
                          **params)
    np.testing.assert_array_equal(r.decision, off.decision)
    np.testing.assert_array_equal(r.label, off.label)
    assert np.all(r.score_lo <= off.score) and np.all(off.score <= r.score_hi)
    assert np.all(r.score_lo <= r.score) and np.all(r.score <= r.score_hi)
    full = r.stop_reason == "full"
    np.testing.assert_array_equal(full, r.work_units == model.work_total)
    np.testing.assert_array_equal(r.score[full], off.score[full])
    np.testing.assert_array_equal(r.score_lo[full], off.score[full])
    np.testing.assert_array_equal(r.score_hi[full], off.score[full])
    assert set(r.stop_reason) <= {"full", "certificate"}
    return r, off


@pytest.mark.parametrize("name", CERT_MODELS)
@pytest.mark.parametrize("n_rows", ROWS)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_certified_keeps_every_band(name, n_rows, n_threads):
    model = compiled(name)
    X = rows_for(name, n_rows, seed=n_rows)
    full = model.score_batch(X).score
    # thresholds right at, and one 1e-7 step beside, scores the full model really produces
    thr = sorted({0.5, float(full[0]), float(full[-1]) + 1e-7, float(full[n_rows // 2]) - 1e-7})
    check_certified(model, X, thr, n_threads=n_threads)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hypothesis_certified_adversarial(data):
    name = data.draw(st.sampled_from(CERT_MODELS))
    model = compiled(name)
    n = data.draw(st.integers(1, 90))
    X = rows_for(name, n, seed=data.draw(st.integers(0, 2**16)))
    full = model.score_batch(X).score
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
    deltas = data.draw(st.lists(st.sampled_from([0.0, 1e-7, -1e-7, 1e-12, -1e-12, 1e-3]),
                                min_size=len(picks), max_size=len(picks)))
    thr = [float(full[p]) + d for p, d in zip(picks, deltas, strict=True)]
    thr += data.draw(st.lists(st.floats(-2, 2), max_size=2))
    # the exact neighbours of a score: the cruellest threshold there is
    thr.append(float(np.nextafter(full[picks[0]], np.inf)))
    if model.scores_probabilities:  # (thresholds outside a probability are refused)
        thr = [min(max(t, 0.0), 1.0) for t in thr]
    chunk = data.draw(st.sampled_from([1, 2, 3, 8, 13]))
    check_certified(model, X, thr, n_threads=data.draw(st.sampled_from([1, 2])), chunk=chunk)


def _constant_tree(v: float) -> Tree:
    """A depth-1 tree whose two leaves carry the same value: its interval has zero width."""
    return Tree(np.array([0, -1, -1], np.int32), np.array([0.0, np.inf, np.inf], np.float32),
                np.array([1, -1, -1], np.int32), np.array([2, -1, -1], np.int32),
                np.ones(3, bool), np.array([[0.0], [v], [v]]))


def _model(trees, link="sigmoid", task="binary", accumulate="float32", divisor=1.0, base=0.0,
           classes=(0, 1), n_outputs=1, group=None, unit_ptr=None, n_features=1):
    n = len(trees)
    ens = Ensemble(
        trees=trees,
        tree_group=np.zeros(n, np.int32) if group is None else np.asarray(group, np.int32),
        unit_ptr=np.arange(n + 1) if unit_ptr is None else np.asarray(unit_ptr),
        n_outputs=n_outputs, base=np.full(n_outputs, base), divisor=divisor, link=link,
        task=task, n_features=n_features, feature_names=[f"x{i}" for i in range(n_features)],
        classes=list(classes), accumulate=accumulate)
    info, arrays = pack.pack(ens)
    return CompiledModel(meta_of(ens, info), arrays)


@pytest.mark.parametrize("seed", range(6))
def test_certified_float32_rounding_is_covered(seed):
    """Constant trees: the interval is only the rounding slack, and float32 sums of wildly
    scaled leaves round a lot. Thresholds sit exactly on, and one ulp beside, the full score."""
    rng = np.random.default_rng(seed)
    vals = (rng.normal(size=64) * 10.0 ** rng.integers(-4, 5, size=64)).astype(np.float32)
    model = _model([_constant_tree(float(v)) for v in vals], link="identity", task="regression",
                   classes=())
    X = np.zeros((3, 1), np.float32)
    s = model.score_batch(X).score[0]
    exact = math.fsum(float(v) for v in vals)
    for t in (s, np.nextafter(s, np.inf), np.nextafter(s, -np.inf), exact):
        r, off = check_certified(model, X, [float(t)], chunk=1)
    # the slack is not silly: far from the score, the base alone settles the band
    r = model.score_batch(X, lazy="certified", thresholds=[abs(s) * 2 + 1e6], chunk=1)
    assert (r.work_units == 0).all() and (r.stop_reason == "certificate").all()


def test_certified_interval_is_asymmetric_and_tight():
    """Leaves of the same sign: the interval [partial + smin, partial + smax] excludes 0 early."""
    trees = []
    for i in range(40):
        trees.append(Tree(np.array([0, -1, -1], np.int32),
                          np.array([float(i), np.inf, np.inf], np.float32),
                          np.array([1, -1, -1], np.int32), np.array([2, -1, -1], np.int32),
                          np.ones(3, bool), np.array([[0.0], [0.1], [0.3]])))
    model = _model(trees, base=-20.0)
    X = np.array([[-1.0], [100.0]], np.float32)
    r, off = check_certified(model, X, [0.5], chunk=1)
    # base -20 + at most 40 * 0.3 = 12: negative whatever happens -> band 0 before any tree
    assert list(r.work_units) == [0, 0]


def test_off_equals_full_evaluation():
    for name in ("xgb-binary-logistic", "rf-multi", "hgb-multi"):
        model = compiled(name)
        X = rows_for(name, 65, seed=1)
        r = model.score_batch(X, thresholds=[0.5, 0.9])
        s, lab = model.score_from_raw(model.raw(X))
        np.testing.assert_array_equal(r.score, s)
        np.testing.assert_array_equal(r.label, lab)
        assert (r.stop_reason == "full").all() and (r.work_units == model.work_total).all()


# ---- the kernel agrees with the slow Python reference, every policy, every layout ------------

REF_CASES = [
    ("certified", "xgb-binary-logistic", {}), ("certified", "xgb-multi-softprob", {}),
    ("certified", "rf-multi", {"chunk": 3}), ("certified", "hgb-binary", {"chunk": 1}),
    ("certified", "gb-multi", {}), ("certified", "xgb-deep", {"chunk": 5}),
    ("lazyrf", "rf-binary", {"block": 3, "t_min": 3}), ("lazyrf", "rf-binary", {}),
    ("lazyrf", "rf-multi", {"block": 5, "t_min": 5, "tau": 0.8}),
    ("lazyrf", "et-multi", {"block": 2, "t_min": 2, "tau": 0.7}),
    ("lazygbm", "xgb-binary-logistic", {}), ("lazygbm", "xgb-multi-softprob", {}),
    ("lazygbm", "gb-multi", {"variant": "certificate_plus_flip"}),
    ("lazygbm", "hgb-multi", {"t_min": 3}), ("lazygbm", "gb-binary", {"spr_threshold": 1.0}),
    ("lazygbm", "xgb-parallel-tree", {"variant": "certificate_only"}),
]


@pytest.mark.parametrize("lazy,name,params", REF_CASES)
@pytest.mark.parametrize("layout", ["auto", "compact"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_kernel_matches_python_reference(lazy, name, params, layout, n_threads):
    model = compiled(name, layout)
    X = rows_for(name, 130, seed=11)
    thr = [0.3, 0.5, 0.9]
    units, reasons, raw_full = reference(model, X, lazy, thr, **params)
    r = model.score_batch(X, lazy=lazy, thresholds=thr, n_threads=n_threads, **params)
    np.testing.assert_array_equal(r.work_units, units)
    np.testing.assert_array_equal(r.stop_reason, reasons)
    full = reasons == "full"
    np.testing.assert_array_equal(r.score[full], model.score_from_raw(raw_full)[0][full])
    off = model.score_batch(X, thresholds=thr)
    assert np.all(r.score_lo <= off.score) and np.all(off.score <= r.score_hi)
    assert (r.work_units < model.work_total).sum() > 0 or lazy == "certified"


# ---- lazyrf: hand-computed stopping times ------------------------------------------------------

def _stump(thr: float, left, right, feature=0) -> Tree:
    left, right = np.atleast_1d(left), np.atleast_1d(right)
    return Tree(np.array([feature, -1, -1], np.int32),
                np.array([thr, np.inf, np.inf], np.float32), np.array([1, -1, -1], np.int32),
                np.array([2, -1, -1], np.int32), np.ones(3, bool),
                np.stack([np.zeros_like(left, dtype=float), left, right]).astype(float))


def vote_forest(thresholds, lo=0.0, hi=1.0):
    """Binary forest: tree i votes class 1 (leaf P(1) = hi) iff x0 > thresholds[i]."""
    trees = [_stump(t, lo, hi) for t in thresholds]
    return _model(trees, link="vote", accumulate="float64", divisor=float(len(trees)))


def test_binary_tail_by_hand():
    # P(Bin(11, 1/2) <= 8) = 1 - (55 + 11 + 1) / 2048 ; <= 7: 1 - 232 / 2048
    tail = L.rf_binary_tail(10)
    assert tail[8] == 1 - 67 / 2048 and tail[7] == 1 - 232 / 2048
    assert tail[8] > 0.95 > tail[7]
    assert L.rf_binary_tail(0)[0] == 0.5


@pytest.mark.parametrize("n_rows", [1, 63, 64, 65])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_lazyrf_binary_stops_at_10_only_with_8_votes(n_rows, n_threads):
    # trees 0..9 split at 0..9; trees 10..29 always vote 1 (threshold below every input)
    model = vote_forest(list(range(10)) + [-100.0] * 20)
    x0 = np.array([7.5, 6.5, -5.0, 9.5, 8.5, 3.5])  # 8, 7, 0, 10, 9, 4 votes of the first 10
    X = np.resize(x0, n_rows).reshape(-1, 1).astype(np.float32)
    r = model.score_batch(X, lazy="lazyrf", n_threads=n_threads)
    # 8 votes: stop at 10. 7 votes: at 20 there are 17 of 20 (tail(20)[17] > 0.95) -> 20.
    # 0 votes: class 0 leads 10-0 -> 10 (score: soft vote 0). 4 votes: 6-4 at 10 (no), 14 at 20:
    # tail(20)[14] = P(Bin(21) <= 14) = 0.9608 -> stop at 20.
    want_units = {7.5: 10, 6.5: 20, -5.0: 10, 9.5: 10, 8.5: 10, 3.5: 20}
    want_score = {7.5: 0.8, 6.5: 17 / 20, -5.0: 0.0, 9.5: 1.0, 8.5: 0.9, 3.5: 14 / 20}
    assert L.rf_binary_tail(20)[14] > 0.95 > L.rf_binary_tail(20)[13]
    for i, x in enumerate(X[:, 0]):
        assert r.work_units[i] == want_units[float(x)], x
        assert r.stop_reason[i] == "posterior"
        assert r.score[i] == pytest.approx(want_score[float(x)], abs=1e-15)
    off = model.score_batch(X)
    assert np.all(r.score_lo <= off.score) and np.all(off.score <= r.score_hi)


def test_lazyrf_votes_are_hard_and_ties_go_low():
    # leaves P(1) = 0.6 vs 0.4 vote like 1 vs 0; P(1) = 0.5 is a tie: class 0 votes
    model = vote_forest([0.0] * 30, lo=0.5, hi=0.6)
    X = np.array([[1.0], [-1.0]], np.float32)
    r = model.score_batch(X, lazy="lazyrf")
    assert list(r.work_units) == [10, 10]  # unanimous both ways
    assert r.label[0] == 1 and r.label[1] == 0
    assert r.score[0] == pytest.approx(0.6) and r.score[1] == pytest.approx(0.5)


def test_lazyrf_t_min_tau_block():
    model = vote_forest([-100.0] * 40)  # unanimous class 1
    X = np.zeros((5, 1), np.float32)
    assert (model.score_batch(X, lazy="lazyrf", block=4, t_min=10).work_units == 12).all()
    assert (model.score_batch(X, lazy="lazyrf", block=5, t_min=3).work_units == 5).all()
    # tail(4)[5] = 1 - 1/64 = 0.984 > 0.95; tau 0.99 needs tail(5)[...]: 1 - 1/128 = 0.992 at 6
    assert (model.score_batch(X, lazy="lazyrf", block=1, t_min=1, tau=0.99).work_units
            == 6).all()
    r = model.score_batch(X, lazy="lazyrf", tau=1.0)
    assert (r.stop_reason == "full").all() and (r.work_units == 40).all()


def multiclass_vote_forest(votes_per_tree, K=3):
    """Tree i: leaf distribution one-hot on class votes_per_tree[i] for every input."""
    trees = [_stump(0.0, np.eye(K)[c], np.eye(K)[c]) for c in votes_per_tree]
    return _model(trees, link="vote", task="multiclass", accumulate="float64",
                  divisor=float(len(trees)), classes=tuple(range(K)), n_outputs=K,
                  group=[-1] * len(trees))


def test_lazyrf_multiclass_monte_carlo_and_gaussian():
    X = np.zeros((2, 1), np.float32)
    # unanimous class 2 for 10 trees: A = 13 < 30 -> Monte Carlo; Dir(1, 1, 11) puts class 2 on
    # top almost surely -> stop at 10
    r = multiclass_vote_forest([2] * 40).score_batch(X, lazy="lazyrf")
    assert (r.work_units == 10).all() and (r.label == 2).all()
    s = L.rf_posterior([0, 0, 10], 10)
    assert s > 0.99 and s == _lazy.lazy_mc_score(np.array([0, 0, 10]), 2, 256, 0)
    # 5/3/2 for 30 trees (A = 33: Gaussian): mu = 3/33, by hand
    seq = [0, 0, 0, 0, 0, 1, 1, 1, 2, 2] * 3 + [0] * 30
    a1, a2, A = 16.0, 10.0, 33.0
    var = (a1 * (A - a1) + a2 * (A - a2) + 2 * a1 * a2) / (A * A * (A + 1))
    z = (a1 - a2) / A / (math.sqrt(var) + 1e-12)
    want = 0.5 * (1 + math.tanh(0.7978845608 * (z + 0.044715 * z**3)))
    assert L.rf_posterior([15, 9, 6], 30) == pytest.approx(want, rel=1e-15)
    assert want < 0.95
    # t = 10 (5/3/2, MC) and 20 (10/6/4, MC: A = 23) do not stop; 30 (Gaussian) does not;
    # 40 = 25/9/6: A = 43 -> Gaussian, clearly dominant
    assert L.rf_posterior([5, 3, 2], 10) < 0.95 and L.rf_posterior([10, 6, 4], 20) < 0.95
    assert L.rf_posterior([25, 9, 6], 40) > 0.95
    r = multiclass_vote_forest(seq).score_batch(X, lazy="lazyrf")
    assert (r.work_units == 40).all() and (r.label == 0).all()


def test_mc_score_is_a_dirichlet_probability():
    rng = np.random.default_rng(0)
    counts = np.array([4, 2, 1])
    draws = rng.dirichlet(1 + counts, size=200_000)
    want = (draws.argmax(axis=1) == 0).mean()
    got = _lazy.lazy_mc_score(counts, 0, 20_000, 7)
    assert abs(got - want) < 0.02


# ---- lazygbm: hand-computed stopping times ------------------------------------------------------

def margin_model(signs, w=0.125, K=1):
    """Boosting with stumps of leaf +-w: round s adds signs[s] * w (x0 > 0) or -signs[s] * w."""
    trees, group = [], []
    for s in signs:
        for k in range(K):
            v = s[k] if K > 1 else s
            trees.append(_stump(0.0, -v * w, v * w))
            group.append(k)
    if K == 1:
        return _model(trees)
    return _model(trees, link="softmax", task="multiclass", classes=tuple(range(K)),
                  n_outputs=K, group=group, unit_ptr=np.arange(0, len(trees) + 1, K))


def test_lazygbm_binary_certificate_and_flip_by_hand():
    model = margin_model([1] * 20)
    X = np.array([[1.0], [-1.0]], np.float32)
    # F_t = +-t/8, R_t = (20 - t)/8, V_t = (20 - t)/64. t = 10: |F| = R (not >), flip score
    # exp(-(10/8)^2 / (2 * 10/64)) = e^-5 < e^-3 -> flip at 10.
    r = model.score_batch(X, lazy="lazygbm")
    assert list(r.work_units) == [10, 10] and list(r.stop_reason) == ["flip", "flip"]
    # certificate only: t/8 > (20 - t)/8 first at t = 11
    r = model.score_batch(X, lazy="lazygbm", variant="certificate_only")
    assert list(r.work_units) == [11, 11] and list(r.stop_reason) == ["certificate"] * 2
    # t_min 12 > 11: the certificate is not gated and fires first
    r = model.score_batch(X, lazy="lazygbm", t_min=12)
    assert list(r.work_units) == [11, 11]
    # spr 6: flip needs exp(-m^2/(2V)) < e^-6: t=10: e^-5 no; t=11: certificate first
    r = model.score_batch(X, lazy="lazygbm", spr_threshold=6.0)
    assert list(r.stop_reason) == ["certificate"] * 2
    assert r.score[0] == pytest.approx(1 / (1 + math.exp(-11 / 8)))


def test_lazygbm_alternating_margin_runs_to_the_end():
    model = margin_model([1, -1] * 10)  # F oscillates between 0 and w: never certain
    X = np.array([[1.0]], np.float32)
    r = model.score_batch(X, lazy="lazygbm", variant="certificate_plus_flip")
    assert r.work_units[0] == 20 and r.stop_reason[0] == "full"


def test_lazygbm_multiclass_late_rule_by_hand():
    # class 0 gains 0.125 on odd rounds only; classes 1, 2 never move: m_t = ceil(t/2)/8.
    # w_s = 0.125 on odd rounds, 0 on even ones (all-zero leaves), so with k = (20 - t) // 2
    # odd rounds left after t: R_t = k/8, V_t = k/64.
    signs = [(1 if s % 2 == 0 else 0, 0, 0) for s in range(20)]
    model = margin_model(signs, K=3)
    X = np.array([[1.0]], np.float32)
    for t in range(1, 20):
        k = (20 - t) // 2
        m, R, V = math.ceil(t / 2) / 8, k / 8, k / 64
        cert = m > 2 * R
        flip = t >= 10 and math.exp(-m * m / (2 * (V + 1e-12))) < 2 * math.exp(-3)
        late = t > 16 and m > 0
        if cert or flip or late:
            break
    # t = 10: m = 5/8, V = 5/64: exp(-2.5) = 0.082 < 2 e^-3 = 0.0996
    assert (t, cert, flip, late) == (10, False, True, False)
    r = model.score_batch(X, lazy="lazygbm")
    assert r.work_units[0] == 10 and r.stop_reason[0] == "flip"
    # certificate only: ceil(t/2) > 2 ((20-t) // 2) first at t = 13 (7 > 6)
    r = model.score_batch(X, lazy="lazygbm", variant="certificate_only")
    assert r.work_units[0] == 13 and r.stop_reason[0] == "certificate"
    # the late rule: a tiny flip bound (spr 50) and late_fraction 0.5: t > 10 and m > 0 -> 11
    r = model.score_batch(X, lazy="lazygbm", spr_threshold=50.0, late_fraction=0.5)
    assert r.work_units[0] == 11 and r.stop_reason[0] == "late"
    # default late fraction 0.8: t > 16, but the certificate at 13 comes first
    r = model.score_batch(X, lazy="lazygbm", spr_threshold=50.0)
    assert r.work_units[0] == 13 and r.stop_reason[0] == "certificate"


def test_gbm_rule_ratio_never_fires_after_certificate():
    for m in np.linspace(0, 3, 301):
        assert L.gbm_rule([m, 0.0], 1, 1.0, 1.0, n_units=10, variant="certificate_only") == (
            "certificate" if m > 2.0 else None)


# ---- audit, parameters, edges ------------------------------------------------------------------

def test_audit_counts_and_keeps_stop_reason():
    model = compiled("xgb-binary-logistic")
    X = rows_for("xgb-binary-logistic", 400, seed=5)
    r = model.score_batch(X, lazy="lazygbm", thresholds=[0.5], audit_fraction=0.25)
    mask = L.audit_mask(400, 0.25, 0)
    off = model.score_batch(X, thresholds=[0.5])
    assert r.audit_rows == mask.sum() and 60 < mask.sum() < 140
    want = ((off.decision != r.decision) | (off.label != r.label))[mask].sum()
    assert r.audit_disagreements == want
    assert "audit" not in set(r.stop_reason)
    c = model.score_batch(X, lazy="certified", thresholds=[0.5], audit_fraction=1.0)
    assert (c.audit_rows, c.audit_disagreements) == (400, 0)
    assert not L.audit_mask(100, 0.0).any() and L.audit_mask(100, 1.0).all()


def test_arrow_input_and_empty_batch():
    import pyarrow as pa

    model = compiled("xgb-multi-softprob")
    X = rows_for("xgb-multi-softprob", 70, seed=2)
    table = pa.table({n: X[:, j] for j, n in enumerate(model.feature_names)})
    a = model.score_batch(table, lazy="certified", thresholds=[0.6], audit_fraction=0.5)
    b = model.score_batch(X, lazy="certified", thresholds=[0.6])
    np.testing.assert_array_equal(a.score, b.score)
    np.testing.assert_array_equal(a.work_units, b.work_units)
    assert a.audit_disagreements == 0
    r = model.score_batch(np.zeros((0, M.N_FEATURES), np.float32), lazy="lazygbm")
    assert len(r) == 0 and r.work_units.dtype == np.int32


def test_bad_policy_and_parameters():
    rf, gb = compiled("rf-binary"), compiled("gb-binary")
    X = np.zeros((2, M.N_FEATURES), np.float32)
    with pytest.raises(ValueError, match="lazyrf"):
        gb.score_batch(X, lazy="lazyrf")
    with pytest.raises(ValueError, match="lazygbm"):
        rf.score_batch(X, lazy="lazygbm")
    with pytest.raises(TypeError, match="tau"):
        gb.score_batch(X, lazy="lazygbm", tau=0.9)
    with pytest.raises(ValueError, match="variant"):
        gb.score_batch(X, lazy="lazygbm", variant="nope")
    with pytest.raises(ValueError, match="lazy must be"):
        gb.score_batch(X, lazy="sometimes")
