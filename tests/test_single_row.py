"""The few-rows fast path (Forest.small) against the block kernels and the libraries."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M
from worker import _timing

CASES = [("xgb", "xgb-binary-logistic", "padded"), ("xgb", "xgb-binary-logistic", "compact"),
         ("xgb", "xgb-multi-softprob", "padded"), ("xgb", "xgb-deep", "compact"),
         ("xgb", "xgb-reg-squarederror", "padded"), ("skl", "rf-binary", "compact"),
         ("skl", "rf-multi", "compact"), ("skl", "gb-binary", "padded"),
         ("skl", "gb-exponential", "padded"), ("skl", "gb-multi", "padded")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[1]}-{c[2]}")
def case(request):
    lib, name, layout = request.param
    src = (M.xgboost_models() if lib == "xgb" else M.sklearn_models())[name]
    return name, worker.compile_model(src, layout=layout)


def rows(n, seed=0, nan=True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, M.N_FEATURES)).astype(np.float32)
    X[:, 5] = rng.integers(0, 4, size=n)
    if nan:
        X[rng.random(X.shape) < 0.1] = np.nan
    return X


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_single_rows_match_the_batch_path_to_the_bit(case, dtype):
    name, model = case
    X = rows(300, nan=not name.startswith("gb")).astype(dtype)
    big = model.raw(X, n_threads=1)  # > 64 rows: block kernels
    for i in range(0, 300, 7):
        np.testing.assert_array_equal(model.raw(X[i:i + 1]), big[i:i + 1])
    if model.task != "regression":
        proba = model.predict_proba(X, n_threads=2)
        for i in range(0, 300, 7):
            np.testing.assert_array_equal(model.predict_proba(X[i:i + 1]), proba[i:i + 1])
        np.testing.assert_array_equal(model.predict(X[:1]), model.predict(X)[:1])


def test_a_batch_of_several_link_tasks_links_on_two_threads_to_the_bit(case):
    # more than LINK_TASK_ROWS (8,192) rows: link_proba splits the batch across threads
    name, model = case
    X = rows(2 * 8192 + 37, seed=4, nan=not name.startswith("gb"))
    if model.task == "regression":
        with pytest.raises(AttributeError, match="regressor"):
            model.predict_proba(X, n_threads=2)
        return
    one, two = model.predict_proba(X, n_threads=1), model.predict_proba(X, n_threads=2)
    np.testing.assert_array_equal(two, one)
    for i in (0, 8191, 8192, 16383, 16384, X.shape[0] - 1):  # the tasks' edges
        np.testing.assert_array_equal(model.predict_proba(X[i:i + 1]), two[i:i + 1])
    lib = (M.xgboost_models() if name.startswith("xgb") else M.sklearn_models())[name]
    if name.startswith("xgb"):
        ref = lib.inplace_predict(X)
        ref = np.column_stack([1 - ref, ref]) if ref.ndim == 1 else ref
    else:
        ref = lib.predict_proba(X.astype(np.float64))
    np.testing.assert_allclose(two, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n", [0, 1, 2, 4, 5, 17, 63, 64, 65])
def test_block_edges(case, n):
    _, model = case
    X = rows(n, seed=n, nan=False)
    ref = np.concatenate([model.raw(np.vstack([X, rows(100, seed=9)]), n_threads=1)[:n]])
    np.testing.assert_array_equal(model.raw(X), ref)


def test_fast_path_declines_what_it_cannot_take(case):
    _, model = case
    X = rows(8, nan=False)
    forest = model.forest
    assert forest.small(np.asfortranarray(X), -1) is None  # not C-contiguous
    assert forest.small(X[:, :3], -1) is None  # wrong feature count: general path raises
    assert forest.small(X.astype(np.int32), -1) is None  # other dtypes: general path stages
    assert forest.small(rows(65, nan=False), -1) is None  # more than one block
    np.testing.assert_array_equal(model.raw(np.asfortranarray(X)), model.raw(X))
    np.testing.assert_array_equal(model.raw(X.astype(np.int32)),
                                  model.raw(X.astype(np.int32).astype(np.float32)))
    with pytest.raises(ValueError, match="features"):
        model.raw(X[:, :3])
    # read through numpy's own fields: a byte-swapped or misaligned array, or a subclass, is
    # declined and scored by the general path to the same bits
    swapped = X.astype(">f4")
    raw = np.zeros(X.nbytes + 1, dtype=np.uint8)
    misaligned = raw[1:].view(np.float32).reshape(X.shape)
    misaligned[...] = X
    assert not misaligned.flags.aligned
    sub = X.view(np.matrix) if X.ndim == 2 else X
    for other in (swapped, misaligned, sub):
        assert forest.small(other, -1) is None
        np.testing.assert_array_equal(model.raw(other), model.raw(X))
    if model.task != "regression":
        for other in (swapped, misaligned):
            np.testing.assert_array_equal(model.predict_proba(other), model.predict_proba(X))


def test_single_row_against_xgboost():
    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = worker.compile_model(booster)
    X = rows(50, seed=3)
    for i in range(50):
        p = booster.inplace_predict(X[i:i + 1])
        np.testing.assert_allclose(model.predict_proba(X[i:i + 1])[:, 1], p, atol=1e-6, rtol=0)
        margin = booster.inplace_predict(X[i:i + 1], predict_type="margin")
        np.testing.assert_array_equal(model.predict_margin(X[i:i + 1]), margin)


def test_bench_row_latency_times_every_call():
    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    ns = _timing.bench_row_latency(model.forest, rows(10), 500)
    assert ns.shape == (500,) and ns.dtype == np.int64 and (ns >= 0).all()
