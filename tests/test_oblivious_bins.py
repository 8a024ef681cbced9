"""The oblivious kernel's bins (cyext/oblivious.h sw_obl_bins512, sw_obl_sum512_w) against
CatBoost's own predictions and at their edges.

A block of more than 16 rows of a model with the bins built bins each column its levels read
once (a byte: how many of the column's thresholds the key exceeds, found by a binary search in
registers: one level of 5 steps for 31 thresholds or fewer, two levels past that, at most 255),
then reads every tree as byte compares and picks its float64 leaves as four 16-bit words. The
scores must be CatBoost's to the bit (and the walks', and the halves'), on hostile rows at the
block edges, at every depth 1-6, both missing-value sides, thresholds counted to each edge of
the search (1, 15, 16, 31, 32, 33, 63, 64, 254, 255), and keys on, beside and past every
threshold."""

from __future__ import annotations

import numpy as np
import pytest

from tests import models as M
from tests.test_oblivious import _catboost_borders as _borders
from worker.model.compile import chosen, to_ir

catboost = pytest.importorskip("catboost", reason="pip install catboost (the test extras)")

SIZES = (17, 31, 32, 33, 63, 64, 65, 127, 129, 300)


def _bins_cpu() -> bool:
    from worker import _kernels

    arrays, _ = M.padded_stumps(64)
    f = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "oblivious", "sum")
    return f.oblivious_simd() == "avx512" and f.oblivious_bins(True)


needs_bins = pytest.mark.skipif(not _bins_cpu(), reason="no AVX-512 BW on this CPU: the bins "
                                "are never built (tests below check that they are refused)")


def _rows(n: int, borders: np.ndarray, seed: int, width: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=1.5, size=(n, width)).astype(np.float32)
    pick = rng.random(X.shape)
    X[pick < 0.35] = rng.choice(borders, size=int((pick < 0.35).sum()))
    X[(pick >= 0.35) & (pick < 0.4)] = np.float32(0.0)
    X[(pick >= 0.4) & (pick < 0.43)] = np.float32(-0.0)
    X[(pick >= 0.43) & (pick < 0.5)] = np.nan
    X[(pick >= 0.5) & (pick < 0.52)] = np.inf
    X[(pick >= 0.52) & (pick < 0.54)] = -np.inf
    return X


@pytest.fixture(scope="module")
def cb_models():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(2000, 8)).astype(np.float32)
    X[:, 3] = rng.integers(0, 4, size=2000)  # rows on the thresholds
    X[rng.random(X.shape) < 0.05] = np.nan
    c = np.nan_to_num(X)
    y = (c[:, 0] + c[:, 1] * c[:, 2] + 0.5 * c[:, 3] + rng.normal(scale=0.5, size=2000) > 1)
    kw = dict(verbose=0, random_seed=0, thread_count=1, allow_writing_files=False)
    C, R = catboost.CatBoostClassifier, catboost.CatBoostRegressor
    out = {}
    for depth in range(1, 7):
        for nan in ("Min", "Max"):
            cls = C if depth % 2 else R
            target = y.astype(int) if cls is C else c[:, 0] * 2 - c[:, 4]
            out[f"d{depth}-{nan}"] = cls(iterations=120, depth=depth, nan_mode=nan,
                                         **kw).fit(X, target)
    return X.shape[1], out


@needs_bins
@pytest.mark.parametrize("depth", range(1, 7))
@pytest.mark.parametrize("nan", ["Min", "Max"])
def test_catboost_scores_by_the_bins_are_catboosts_to_the_bit(cb_models, depth, nan):
    width, models = cb_models
    model = models[f"d{depth}-{nan}"]
    m = chosen(to_ir(model), "padded", "oblivious")
    f = m.forest
    assert f.oblivious_bins(True) is True
    walks = chosen(to_ir(model), "padded", "walk")
    borders = _borders(model)
    for seed, n in enumerate(SIZES):
        X = _rows(n, borders, seed, width)
        want = np.asarray(model.predict(X, prediction_type="RawFormulaVal"),
                          dtype=np.float64).reshape(n, 1)
        for bins in (True, False):
            assert f.oblivious_bins(bins) is bins
            for threads in (1, 2):
                np.testing.assert_array_equal(m.raw(X, n_threads=threads), want,
                                              err_msg=f"d{depth} {nan}, bins {bins}, {n} rows,"
                                                      f" {threads} threads")
        np.testing.assert_array_equal(walks.raw(X), want, err_msg=f"walks, {n} rows")


def _stump_forest(thresholds: np.ndarray, T: int, seed: int, sides: int = 2):
    """T padded stumps (depth 1) on feature 0, their thresholds drawn from `thresholds` (each
    at least once), missing values to either side (sides 2: two columns of the block) or to
    the left (1: one column), float64 leaves."""
    from worker import _kernels

    rng = np.random.default_rng(seed)
    thr = np.concatenate([thresholds, rng.choice(thresholds, T - thresholds.size)])
    rng.shuffle(thr)
    side = rng.integers(0, sides, T).astype(np.uint32)  # node key 2f + missing-goes-right
    arrays = {"pnodes": np.stack([side, thr.astype(np.float32).view(np.uint32)], 1),
              "leaves": rng.normal(size=(2 * T, 1)) * 10.0 ** rng.integers(-8, 8, (2 * T, 1)),
              "tree_group": np.zeros(T, dtype=np.int32), "base": np.zeros(1)}
    f = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "oblivious", "sum")
    return f, arrays, thr, side


def _reference(X: np.ndarray, thr: np.ndarray, side: np.ndarray, leaves: np.ndarray):
    """The stumps' sums in tree order, by numpy float64: right when x > threshold, missing
    values to the side the key says."""
    x = X[:, 0].astype(np.float64)[:, None]
    right = np.where(np.isnan(x), side[None, :] == 1, x > thr.astype(np.float64)[None, :])
    picked = np.where(right, leaves[1::2, 0][None, :], leaves[0::2, 0][None, :])
    out = np.zeros(X.shape[0])
    for t in range(thr.size):  # one add a tree, in order: the kernels' rounding
        out = out + picked[:, t]
    return out


@needs_bins
@pytest.mark.parametrize("count", [1, 15, 16, 31, 32, 33, 63, 64, 254, 255])
def test_every_threshold_count_to_the_searchs_edges_scores_as_numpy(count):
    from worker import _kernels

    rng = np.random.default_rng(count)
    thresholds = np.unique(np.concatenate([
        np.float32([-np.inf, np.finfo(np.float32).min, -1.0, -0.0, 1e-45, 1.0,
                    np.finfo(np.float32).max]),
        rng.normal(size=400).astype(np.float32)]))[:count]
    if thresholds.size < count:
        pytest.fail("not enough distinct thresholds drawn")
    f, arrays, thr, side = _stump_forest(thresholds, max(600, 2 * count), seed=count,
                                         sides=1 + count % 2)
    assert f.oblivious_bins(True) is True
    walks = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "walk", "sum")
    with np.errstate(over="ignore"):
        near = np.concatenate([thresholds, np.nextafter(thresholds, np.float32(np.inf)),
                               np.nextafter(thresholds, np.float32(-np.inf)),
                               np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0])])
    for n in SIZES:
        X = np.zeros((n, 5), dtype=np.float32)
        X[:, 0] = rng.choice(near, n)
        cols = _kernels.Columns.from_numpy(X)
        want = _reference(X, thr, side, arrays["leaves"])
        for bins in (True, False):
            f.oblivious_bins(bins)
            np.testing.assert_array_equal(f.raw(cols, 1)[:, 0], want,
                                          err_msg=f"{count} thresholds, bins {bins}, {n} rows")
        np.testing.assert_array_equal(walks.raw(cols, 1)[:, 0], want)


def test_a_column_of_256_thresholds_is_not_binned_and_scores_by_the_halves():
    """A bin is a byte: a column asked 256 distinct thresholds keeps the halves."""
    from worker import _kernels

    thresholds = np.unique(np.random.default_rng(1).normal(size=300).astype(np.float32))[:256]
    f, arrays, thr, side = _stump_forest(thresholds, 600, seed=3, sides=1)
    assert f.oblivious_bins(True) is False
    g = _stump_forest(thresholds[:255], 600, seed=3, sides=1)[0]
    assert g.oblivious_bins(True) is _bins_cpu()  # 255: binned
    X = np.zeros((100, 5), dtype=np.float32)
    X[:, 0] = np.random.default_rng(2).choice(thresholds, 100)
    np.testing.assert_array_equal(f.raw(_kernels.Columns.from_numpy(X), 1)[:, 0],
                                  _reference(X, thr, side, arrays["leaves"]))


def test_the_bins_are_built_only_where_the_trees_pay_for_binning(cb_models):
    """Binning a column costs a block what about 3 trees save where it has 31 thresholds or
    fewer, and 8 past that (bench/oblivious_words.c): the kernel builds the bins for at least
    4 trees a column of the first kind and 8 of the second, and not below."""
    from worker import _kernels

    if not _bins_cpu():
        pytest.skip("no AVX-512 BW: never built")
    for T, built in ((39, False), (40, True)):  # 10 columns: 5 features, both sides
        arrays = _stump_forest(np.float32([-1.0, 0.0, 1.0]), T, seed=T)[1]
        arrays["pnodes"][:, 0] = np.arange(T, dtype=np.uint32) % 10
        f = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "oblivious", "sum")
        assert f.oblivious_bins() is built, T
    # 2 columns of 40 thresholds (8 trees each) and k of one (4 each), one stump on each:
    # 80 + k trees pay for 16 + 4k up to k = 21
    many = np.unique(np.random.default_rng(4).normal(size=60).astype(np.float32))[:40]
    for k, built in ((21, True), (22, False)):
        thr = np.concatenate([many, many, np.zeros(k, dtype=np.float32)])
        col = np.concatenate([np.zeros(40), np.ones(40), 2 + np.arange(k)]).astype(np.uint32)
        arrays = _stump_forest(np.float32([0.0]), 80 + k, seed=k)[1]
        arrays["pnodes"] = np.stack([col, thr.view(np.uint32)], 1)
        f = _kernels.Forest(arrays, "padded", 1, 40, 1, 1.0, "oblivious", "sum")
        assert f.oblivious_bins() is built, k
        assert f.oblivious_bins(True) is True, k  # built when asked


def test_models_the_bins_do_not_apply_to_are_refused_and_score_as_before(cb_models):
    """Float32 sums (XGBoost stumps), several scores (MultiClass), depth 7 and more, and modes
    other than AVX-512: the bins are not built, or not in force, and the scores are unchanged."""
    import xgboost as xgb

    width, models = cb_models
    X = _rows(200, _borders(models["d6-Min"]), 0, width)
    y = (np.nan_to_num(X[:, 0]) > 0).astype(int)
    Xf = M.finite_for_library(X)  # XGBoost refuses +-inf
    multi = catboost.CatBoostClassifier(iterations=40, depth=4, loss_function="MultiClass",
                                        verbose=0, thread_count=1, random_seed=0,
                                        allow_writing_files=False).fit(
        Xf, y + (np.nan_to_num(X[:, 1]) > 0))
    deep = catboost.CatBoostRegressor(iterations=40, depth=7, verbose=0, thread_count=1,
                                      random_seed=0, allow_writing_files=False).fit(Xf, y)
    stumps = xgb.train({"objective": "binary:logistic", "max_depth": 1, "seed": 0},
                       xgb.DMatrix(Xf, label=y), num_boost_round=200)
    for name, model in (("multiclass", multi), ("depth 7", deep), ("xgboost", stumps)):
        m = chosen(to_ir(model), "padded", "oblivious")
        assert m.forest.oblivious_bins(True) is False, name
        assert m.forest.oblivious_bins() is False, name
    m = chosen(to_ir(models["d6-Min"]), "padded", "oblivious")
    want = np.asarray(models["d6-Min"].predict(X, prediction_type="RawFormulaVal")).reshape(-1, 1)
    best = m.forest.oblivious_simd()
    built = m.forest.oblivious_bins(True)
    for mode in ("row", "avx2", "avx512")[:("row", "avx2", "avx512").index(best) + 1]:
        m.forest.oblivious_simd(mode)
        assert m.forest.oblivious_bins() is (built and mode == "avx512"), mode
        np.testing.assert_array_equal(m.raw(X), want, err_msg=mode)


@needs_bins
def test_a_threshold_no_key_exceeds_is_no_border():
    """Pass-through levels (a tree shallower than the padded depth, CatBoost's bias tree) ask
    column 0 > +inf, which no key of a missing-left column exceeds: such a level takes j =
    255 and costs no border, so 255 thresholds and +inf are binned. On a missing-right column
    NaN's key exceeds +inf's: there +inf is a border, and 255 and +inf are 256, not binned."""
    from worker import _kernels

    finite = np.unique(np.random.default_rng(6).normal(size=400).astype(np.float32))[:255]
    thresholds = np.concatenate([finite, np.float32([np.inf])])
    near = np.concatenate([finite, np.nextafter(finite, np.float32(np.inf)),
                           np.float32([np.nan, np.inf, -np.inf, np.finfo(np.float32).max])])
    for side, built in ((0, True), (1, False)):
        f, arrays, thr, sides = _stump_forest(thresholds, 800, seed=side, sides=1)
        arrays["pnodes"][:, 0] = side
        sides[:] = side
        f = _kernels.Forest(arrays, "padded", 1, 5, 1, 1.0, "oblivious", "sum")
        assert f.oblivious_bins(True) is built, side
        X = np.zeros((300, 5), dtype=np.float32)
        X[:, 0] = np.random.default_rng(side).choice(near, 300)
        np.testing.assert_array_equal(f.raw(_kernels.Columns.from_numpy(X), 1)[:, 0],
                                      _reference(X, thr, sides, arrays["leaves"]),
                                      err_msg=f"side {side}")


@needs_bins
def test_a_catboost_bias_tree_scores_as_catboost_by_the_bins():
    """A regressor's bias (a tree of pass-through levels) and border_count 255."""
    rng = np.random.default_rng(10)
    X = rng.normal(size=(4000, 3)).astype(np.float32)
    X[rng.random(X.shape) < 0.05] = np.nan
    y = 3.0 + np.nan_to_num(X[:, 0]) * 2 + rng.normal(scale=0.1, size=4000)
    model = catboost.CatBoostRegressor(iterations=400, depth=6, border_count=255, verbose=0,
                                       thread_count=1, random_seed=0,
                                       allow_writing_files=False).fit(X, y)
    assert model.get_scale_and_bias()[1] != 0
    m = chosen(to_ir(model), "padded", "oblivious")
    assert m.forest.oblivious_bins(True) is True
    borders = _borders(model)
    for seed, n in enumerate((17, 64, 300)):
        Xt = _rows(n, borders, seed, 3)
        np.testing.assert_array_equal(
            m.raw(Xt), np.asarray(model.predict(Xt, prediction_type="RawFormulaVal")).reshape(
                n, 1), err_msg=f"{n} rows")


@needs_bins
def test_switching_the_bins_while_threads_score_never_changes_a_score(cb_models):
    """oblivious_bins(on) is read once a block: flipped 400 times while two threads score,
    every score is CatBoost's."""
    import threading

    width, models = cb_models
    model = models["d6-Min"]
    m = chosen(to_ir(model), "padded", "oblivious")
    assert m.forest.oblivious_bins(True) is True
    X = _rows(700, _borders(model), 3, width)
    want = np.asarray(model.predict(X, prediction_type="RawFormulaVal")).reshape(-1, 1)
    stop, bad, runs = threading.Event(), [], [0]

    def score():
        while not stop.is_set():
            got = m.raw(X, n_threads=1)
            runs[0] += 1
            if not np.array_equal(got, want):
                bad.append(np.flatnonzero((got != want).any(axis=1))[:5])

    threads = [threading.Thread(target=score) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(400):
        m.forest.oblivious_bins(i % 2 == 0)
    stop.set()
    for t in threads:
        t.join()
    assert not bad and runs[0] > 0, bad[:3]


_STACK_RUN = """
import pickle, sys, threading
import numpy as np
from worker.model.compile import chosen, to_ir
model = pickle.load(open(sys.argv[2], "rb"))
m = chosen(to_ir(model), "padded", "oblivious")
bins = sys.argv[5] == "1"
assert m.forest.oblivious_bins(bins) is bins
X = np.load(sys.argv[3])
out = {}
def run():
    for n in (17, 300, 2055):
        out[f"n{n}"] = m.raw(X[:n], n_threads=2)[:, 0]
threading.stack_size(int(sys.argv[1]) * 1024)
t = threading.Thread(target=run)
t.start()
t.join()
np.savez(sys.argv[4], **out)
"""


@pytest.mark.parametrize("bins", [False, True])
def test_small_thread_stacks_score_with_the_oblivious_kernel(cb_models, bins, tmp_path):
    """The bins live on the heap: a Python thread of 92 KiB and OpenMP threads of 88 KiB score
    as before the bins, with them on or off (before: 16 KB more of eval_oblivious's frame on
    every thread overflowed stacks of 84-96 KiB, SIGSEGV, the hostile review)."""
    import os
    import pickle
    import subprocess
    import sys

    if bins and not _bins_cpu():
        pytest.skip("no AVX-512 BW: the bins are never built")
    width, models = cb_models
    model = models["d6-Min"]
    X = _rows(2055, _borders(model), 12, width)
    (tmp_path / "m.pkl").write_bytes(pickle.dumps(model))
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "stack.py").write_text(_STACK_RUN)
    env = {**os.environ, "OMP_STACKSIZE": "88k", "PYTHONPATH": os.getcwd()}
    run = subprocess.run([sys.executable, str(tmp_path / "stack.py"), "92",
                          str(tmp_path / "m.pkl"), str(tmp_path / "x.npy"),
                          str(tmp_path / "out.npz"), "1" if bins else "0"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    want = np.asarray(model.predict(X, prediction_type="RawFormulaVal"))
    got = np.load(tmp_path / "out.npz")
    assert sorted(got) == ["n17", "n2055", "n300"]
    for name in got:
        n = int(name[1:])
        np.testing.assert_array_equal(got[name], want[:n], err_msg=name)
