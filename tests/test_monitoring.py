"""Flight monitoring (issue 51): the reference profile, the native counts, PSI and the rates,
each checked against an independent numpy computation on the same rows; drifts a user would
meet found, a clean stream not."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
import xgboost as xgb

from tests.test_hostile_runs import MODEL, ROOT, _recording
from worker import _kernels, _monitor, demo, monitoring
from worker.config import Settings
from worker.model import reference as R
from worker.model.artifact import ArtifactError
from worker.model.compile import compile_model
from worker.model.compiled import CompiledModel, load_model
from worker.pipeline import BatchStats

_MODELS: dict[int, CompiledModel] = {}


def _model(nf: int) -> CompiledModel:
    if nf not in _MODELS:
        rng = np.random.default_rng(nf)
        X = rng.normal(size=(600, nf)).astype(np.float32)
        y = (X[:, 0] + rng.normal(size=600) > 0).astype(int)
        b = xgb.train({"max_depth": 3, "objective": "binary:logistic"},
                      xgb.DMatrix(X, y), 10)
        _MODELS[nf] = compile_model(b).with_reference(
            rng.normal(size=(2000, nf)).astype(np.float32))
    return _MODELS[nf]


def _hostile(n: int, nf: int, edges: list[np.ndarray], seed: int = 0) -> np.ndarray:
    """Rows with NaN, +-inf, zeros, the largest floats and values exactly on bin edges."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, nf)).astype(np.float32) * 2
    for j in range(nf):
        on = rng.random(n) < 0.2
        if len(edges[j]):
            X[on, j] = rng.choice(edges[j], on.sum())
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, np.finfo(np.float32).max,
                        -np.finfo(np.float32).max], np.float32)
    mask = rng.random((n, nf)) < 0.15
    X[mask] = rng.choice(special, mask.sum())
    return X


def _want(X: np.ndarray, p: R.Profile) -> np.ndarray:
    """The counts by numpy alone: bins by searchsorted, missing, below min, above max."""
    out = np.zeros_like(p.new_counts())
    for j in range(X.shape[1]):
        v = X[:, j]
        m = int(p.n_edges[j])
        present = v[~np.isnan(v)]
        out[j, :m + 1] = np.bincount(np.searchsorted(p.edges[j, :m], present, side="right"),
                                     minlength=m + 1)
        out[j, m + 1] = np.isnan(v).sum()
        out[j, m + 2] = (present < p.lo[j]).sum()
        out[j, m + 3] = (present > p.hi[j]).sum()
    return out


@pytest.mark.parametrize("nf", [1, 7, 16, 33])
@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000])
def test_counts_equal_numpy_on_hostile_rows(nf, n):
    m = _model(nf)
    p = m.reference
    X = _hostile(n, nf, [p.edges[j, :p.n_edges[j]] for j in range(nf)], seed=n)
    stats = BatchStats()
    monitoring.count(m, X, np.zeros(n), stats)
    np.testing.assert_array_equal(stats.monitor["live"][0], _want(X, p))
    # a float64 block and a Fortran-ordered one (through column descriptors): the same
    for other in (X.astype(np.float64), np.asfortranarray(X)):
        stats = BatchStats()
        monitoring.count(m, other, np.zeros(n), stats)
        np.testing.assert_array_equal(stats.monitor["live"][0], _want(X, p))
    # the same rows as Arrow columns (staged a block at a time): the same counts
    stats = BatchStats()
    t = pa.table({f"f{j}": pa.array(X[:, j]) for j in range(nf)})
    monitoring.count(m, m.columns(t), np.zeros(n), stats)
    np.testing.assert_array_equal(stats.monitor["live"][0], _want(X, p))


def test_nulls_and_integer_columns_are_counted_as_staged():
    m = _model(3)
    p = m.reference
    cols = [pa.array([1, None, -3, 0] * 100, pa.int32()),
            pa.array([0.5, float("nan"), None, 2.0] * 100, pa.float64()),
            pa.array([True, False, None, True] * 100)]
    t = pa.table({f"f{j}": c for j, c in enumerate(cols)})
    staged = _monitor.stage(m.columns(t))
    assert np.isnan(staged[1, 1]) and np.isnan(staged[2, 1]) and np.isnan(staged[2, 2])
    stats = BatchStats()
    monitoring.count(m, m.columns(t), np.zeros(400), stats)
    np.testing.assert_array_equal(stats.monitor["live"][0], _want(staged, p))


def test_count_bins_refuses_shapes_that_disagree():
    p = _model(7).reference
    cols = _kernels.Columns.from_numpy(np.zeros((4, 7), np.float32))
    bad = [(p.edges[:6], p.n_edges, p.lo, p.hi, p.new_counts()),
           (p.edges, p.n_edges, p.lo, p.hi, p.new_counts()[:, :-1]),
           (p.edges, np.full(7, 300, np.int32), p.lo, p.hi, p.new_counts()),
           (p.edges, np.full(7, -1, np.int32), p.lo, p.hi, p.new_counts()),
           (np.zeros((7, 256), np.float32), np.zeros(7, np.int32), p.lo, p.hi,
            np.zeros((7, 300), np.int64))]
    for args in bad:
        with pytest.raises(ValueError):
            _monitor.count_bins(cols, *args)
    plan = p.plan
    for args in ((np.zeros((4, 6), np.float32), p.new_counts()),
                 (cols, p.new_counts()[:, :-1]),
                 (cols, p.new_counts(), np.zeros(4), np.zeros(len(p.score_edges), np.int64)),
                 (_kernels.Columns.from_numpy(np.zeros((4, 8), np.float32)), p.new_counts())):
        with pytest.raises(ValueError):
            plan.count(*args)
    for block in (np.zeros((4, 7), np.float32)[:, ::2], np.zeros(7, np.float32),
                  np.zeros((4, 6)), "rows"):
        with pytest.raises((ValueError, TypeError)):
            _monitor.count_bins(block, p.edges, p.n_edges, p.lo, p.hi, p.new_counts())
    # a float64 block or a strided one is staged as the kernels stage it: the same counts
    X = _hostile(40, 7, [p.edges[j, :p.n_edges[j]] for j in range(7)], seed=4)
    for block in (X.astype(np.float64), np.asfortranarray(X), np.repeat(X, 2, 1)[:, ::2]):
        got = p.new_counts()
        _monitor.count_bins(block, p.edges, p.n_edges, p.lo, p.hi, got)
        np.testing.assert_array_equal(got, _want(X, p))
    for score, bins in ((np.zeros(5), np.zeros(len(p.score_edges) + 1, np.int64)),
                        (np.zeros(4), np.zeros(len(p.score_edges) + 1, np.int32)),
                        (np.zeros((4, 1)), np.zeros(len(p.score_edges) + 1, np.int64))):
        counts = p.new_counts()
        with pytest.raises(ValueError):  # checked before anything is counted
            plan.count(cols, counts, score, bins)
        assert not counts.any() and not bins.any()


def _split(n: int, seed: int) -> list[int]:
    """Call sizes summing to n: mostly one to four rows, now and then a larger block."""
    rng = np.random.default_rng(seed)
    out = []
    while sum(out) < n - 3:
        out.append(int(rng.choice([1, 1, 1, 2, 3, 4, 5, 63, 64, 65, 300])))
    out[-1] -= sum(out) - (n - 3)
    return [k for k in out if k] + [1, 1, 1]  # (the last rows kept when the counts are read)


@pytest.mark.parametrize("nf", [1, 7, 16, 33])
def test_score_batch_monitor_counts_every_row_as_numpy_does(nf):
    """``score_batch(X, monitor=model.monitor_counts())``: rows counted in calls of one to a
    few rows (kept and counted together) and larger blocks equal numpy's counts of all the
    rows, and the scores' bins numpy's bins of the scores returned, whenever read."""
    m = _model(nf)
    p = m.reference
    X = _hostile(1500, nf, [p.edges[j, :p.n_edges[j]] for j in range(nf)], seed=nf + 1)
    c = m.monitor_counts()
    scores, i = [], 0
    for k in _split(len(X), nf):
        scores.append(m.score_batch(X[i:i + k], thresholds=[0.5], monitor=c).score)
        if i < 66 <= i + k or i < 500 <= i + k or i + k == 1:  # read midway: every row so far
            np.testing.assert_array_equal(c.counts, _want(X[:i + k], p))
        i += k
    score = np.concatenate(scores)
    np.testing.assert_array_equal(c.counts, _want(X, p))
    np.testing.assert_array_equal(
        c.score_counts, np.bincount(np.searchsorted(p.score_edges, score, side="right"),
                                    minlength=len(p.score_edges) + 1))
    assert c.rows == len(X)
    got = c.counts
    got[0, 0] += 7  # a copy: the counter's own counts are its alone
    np.testing.assert_array_equal(c.counts, _want(X, p))
    c.reset()
    assert c.rows == 0 and not c.counts.any() and not c.score_counts.any()
    m.score_batch(X[:3], monitor=c)
    np.testing.assert_array_equal(c.counts, _want(X[:3], p))


def test_score_batch_monitor_reads_frames_and_other_dtypes_as_the_kernels_stage_them():
    pd = pytest.importorskip("pandas")
    m = _model(7)
    p = m.reference
    X = _hostile(200, 7, [p.edges[j, :p.n_edges[j]] for j in range(7)], seed=11)
    frame = pd.DataFrame({f"f{j}": X[:, j] for j in reversed(range(7))})  # by name
    for rows in (frame, X.astype(np.float64), np.asfortranarray(X), X.tolist()):
        c = m.monitor_counts()
        for i in range(0, 200, 50):
            part = rows.iloc[i:i + 50] if rows is frame else rows[i:i + 50]
            m.score_batch(part, monitor=c)
        np.testing.assert_array_equal(c.counts, _want(X, p))


def test_score_batch_monitor_figures_equal_numpy_on_one_row_calls():
    m = _model(7)
    X = np.random.default_rng(98).normal(size=(5000, 7)).astype(np.float32)
    X[:, 2] *= 100
    c = m.monitor_counts()
    for i in range(len(X)):
        m.score_batch(X[i:i + 1], monitor=c)
    f = c.figures()
    psis, missing, score_psi = _independent(m, X)
    np.testing.assert_allclose([f["feature_psi"][f"f{j}"] for j in range(7)], psis, rtol=0,
                               atol=1e-9)
    np.testing.assert_allclose([f["missing_rate"][f"f{j}"] for j in range(7)], missing,
                               rtol=0, atol=1e-12)
    assert abs(f["score_psi"] - score_psi) <= 1e-9
    assert f["counted"] == 5000 and f["feature_psi"]["f2"] > 0.25
    assert f["out_of_range_rate"]["f2"] > 0.9


def test_score_batch_monitor_refuses_another_models_counts_and_bad_scores():
    a, b = _model(7), _model(16)
    c = a.monitor_counts()
    X = np.zeros((1, 16), np.float32)
    with pytest.raises(ValueError, match="another model"):
        b.score_batch(X, monitor=c)
    assert c.rows == 0
    bare = load_model(MODEL)
    assert bare.reference is None
    with pytest.raises(ValueError, match="no reference profile"):
        bare.monitor_counts()
    Y = np.zeros((2, 7), np.float32)
    for score in (np.zeros(3), np.zeros((2, 1)), "x", None, 0.5, np.array(["a", "b"])):
        with pytest.raises((ValueError, TypeError)):
            c.add(Y, score)
    for score in (None, 0.5, "0.5"):  # one row: a missing or mistyped score is no NaN either
        with pytest.raises((ValueError, TypeError)):
            c.add(Y[:1], score)
    assert c.rows == 0 and not c.score_counts.any()
    with pytest.raises(ValueError, match="own reference"):  # another profile's plan
        type(c)(b.reference.plan, a)
    X = np.random.default_rng(1).normal(size=(50, 7)).astype(np.float32)
    with pytest.raises(ValueError):  # a call that fails counts nothing
        a.score_batch(X, explain="nope", monitor=c)
    assert c.rows == 0


def test_score_batch_monitor_keeps_a_binary_models_few_rows():
    """Review finding: a binary model's scores are a column of its probabilities (strided);
    two to four rows then skipped the kept rows and were counted one call at a time. The
    same counts either way; here the kept path is taken (the counts grow only when read)."""
    m = _model(7)
    p = m.reference
    X = _hostile(4, 7, [p.edges[j, :p.n_edges[j]] for j in range(7)], seed=3)
    r = m.score_batch(X)
    assert r.score.strides == (16,)  # (the premise: a column of the probabilities)
    c = m.monitor_counts()
    for k in (1, 2, 3, 4):
        c.add(X[:k], m.score_batch(X[:k]).score)
    assert c.npend == 10  # every call's rows kept
    np.testing.assert_array_equal(c.counts, _want(np.concatenate([X[:k] for k in (1, 2, 3, 4)]),
                                                  p))


def test_plan_refuses_edges_that_do_not_ascend():
    p = _model(7).reference
    for e in ([1, 0, -1], [0, np.nan, 2]):
        with pytest.raises(ValueError, match="ascend"):
            _monitor.Plan(np.float32([e]), np.int32([3]), np.float32([-5]), np.float32([5]),
                          np.zeros(0), 7)
    with pytest.raises(ValueError, match="ascend"):
        _monitor.Plan(p.edges, p.n_edges, p.lo, p.hi, p.score_edges[::-1].copy(), p.width)
    with pytest.raises(ValueError):
        _monitor.Plan(np.zeros((0, 1), np.float32), np.zeros(0, np.int32), np.zeros(0, np.float32),
                      np.zeros(0, np.float32), np.zeros(0), -1)


def _psi(a_counts: np.ndarray, e: np.ndarray) -> float:
    a = a_counts / a_counts.sum()
    a, e = np.where(a < 1e-4, 1e-4, a), np.where(e < 1e-4, 1e-4, e)
    return float(((a - e) * np.log(a / e)).sum())


def _window(m: CompiledModel, X: np.ndarray, settings=None) -> dict:
    settings = settings or Settings(source={"type": "file", "path": "x"},
                                    model={"path": "x"})
    mon = monitoring.Monitor(m, settings, clock=lambda: 0.0)
    stats = BatchStats()
    r = m.score_batch(X)
    monitoring.count(m, X, r.score, stats)
    stats.account(r)
    mon.add(stats)
    return mon.close()


def _independent(m: CompiledModel, X: np.ndarray) -> tuple[list[float], list[float], float]:
    """Each feature's PSI and missing rate, and the score's PSI, by numpy from the stored
    profile's JSON alone."""
    doc = m.meta["reference"]
    psis, missing = [], []
    for j, f in enumerate(doc["features"]):
        v = X[:, j]
        e = np.asarray(f["edges"], np.float32)
        present = v[~np.isnan(v)]
        a = np.append(np.bincount(np.searchsorted(e, present, side="right"),
                                  minlength=len(e) + 1), np.isnan(v).sum())
        psis.append(_psi(a.astype(np.float64), np.append(f["fractions"], f["missing"])))
        missing.append(float(np.isnan(v).mean()))
    score = m.score_batch(X).score
    se = np.asarray(doc["score"]["edges"])
    sa = np.bincount(np.searchsorted(se, score, side="right"), minlength=len(se) + 1)
    return psis, missing, _psi(sa.astype(np.float64), np.asarray(doc["score"]["fractions"]))


@pytest.mark.parametrize("drift", ["none", "null", "scaled", "shifted"])
def test_psi_and_rates_equal_numpy_and_find_each_drift(drift):
    m = _model(7)
    X = np.random.default_rng(99).normal(size=(20_000, 7)).astype(np.float32)
    if drift == "null":
        X[:, 2] = np.nan
    elif drift == "scaled":
        X[:, 2] *= 100
    elif drift == "shifted":
        X[:, 2] += 1.0
    w = _window(m, X)
    psis, missing, score_psi = _independent(m, X)
    got = [w["feature_psi"][f"f{j}"] for j in range(7)]
    np.testing.assert_allclose(got, psis, rtol=0, atol=1e-9)
    np.testing.assert_allclose([w["missing_rate"][f"f{j}"] for j in range(7)], missing,
                               rtol=0, atol=1e-12)
    assert abs(w["score_psi"] - score_psi) <= 1e-9
    others = [p for j, p in enumerate(got) if j != 2]
    assert max(others) < 0.02, others  # the features left alone: no drift
    if drift == "none":
        assert got[2] < 0.02 and w["score_psi"] < 0.02, (got, w["score_psi"])
    else:
        assert got[2] > 0.25, got
    if drift == "scaled":
        assert w["out_of_range_rate"]["f2"] > 0.9


def test_a_swapped_model_shifts_the_score_psi():
    m = _model(7)
    X = np.random.default_rng(5).normal(size=(5000, 7)).astype(np.float32)
    rng = np.random.default_rng(6)
    y = (X[:, 1] > 1.0).astype(int)  # another model: fraud on another feature, rarer
    other = compile_model(xgb.train({"max_depth": 3, "objective": "binary:logistic"},
                                    xgb.DMatrix(X, y), 20))
    other = CompiledModel({**other.meta, "reference": m.meta["reference"]}, other.arrays)
    assert _window(m, X)["score_psi"] < 0.02
    assert _window(other, rng.normal(size=(5000, 7)).astype(np.float32))["score_psi"] > 0.25


def test_the_profile_leaves_the_model_id_and_is_checked_at_load(tmp_path):
    m = _model(7)
    plain = CompiledModel({k: v for k, v in m.meta.items() if k != "reference"}, m.arrays)
    assert plain.model_id == m.model_id and plain.reference is None
    path = tmp_path / "m.model"
    assert m.save(path) == m.model_id
    assert load_model(path).reference.rows == 2000
    for field, value in (("rows", 0), ("features", []),
                         ("score", {"edges": [0.2, 0.1]})):
        doc = {**m.meta["reference"], field: value}
        with pytest.raises(ArtifactError, match=f"meta.reference.{field}"):
            CompiledModel({**m.meta, "reference": doc}, m.arrays)
    f0 = dict(m.meta["reference"]["features"][0], edges=[1.0, float("nan")])
    doc = {**m.meta["reference"], "features": [f0, *m.meta["reference"]["features"][1:]]}
    with pytest.raises(ArtifactError, match=r"features\[0\]\.edges"):
        CompiledModel({**m.meta, "reference": doc}, m.arrays)


def test_a_replay_warns_of_a_feature_turned_null_and_a_clean_one_does_not(tmp_path):
    ref = demo.generate(5000, seed=1).select(demo.FEATURES)
    profiled = tmp_path / "profiled.model"
    pq = tmp_path / "ref.arrow"
    with pa.OSFile(str(pq), "wb") as f, pa.ipc.new_file(f, ref.schema) as w:
        w.write_table(ref)
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "profile", str(MODEL),
                           "--reference", str(pq), "-o", str(profiled)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert load_model(profiled).model_id == load_model(MODEL).model_id

    def run(null: bool, shadow: bool = False) -> list[dict]:
        values = []
        for seed in range(2, 12):
            t = demo.generate(300, seed=seed).select([demo.ID_COLUMN, *demo.FEATURES])
            if null:
                i = t.schema.get_field_index("velocity_1h")
                t = t.set_column(i, "velocity_1h", pa.nulls(len(t), pa.int32()))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, t.schema) as w:
                w.write_table(t)
            values.append(sink.getvalue().to_pybytes())
        rec = _recording(tmp_path / f"in-{null}.arrows", values)
        proc = subprocess.run([sys.executable, "-m", "worker.cli", "replay", str(rec),
                               "--model", str(profiled), "--output",
                               str(tmp_path / f"out-{null}-{shadow}.arrows"),
                               *(["--shadow", str(profiled)] if shadow else [])], cwd=ROOT,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "SCORING_WORKER__LOGGING__FORMAT": "json"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = [json.loads(x) for x in (proc.stdout + proc.stderr).splitlines()
                 if x.startswith("{")]
        return [x for x in lines if x.get("event") in ("feature drift", "missing rate jump",
                                                       "score drift")]

    warned = run(True)
    assert {(x["event"], x.get("feature")) for x in warned} >= {
        ("feature drift", "velocity_1h"), ("missing rate jump", "velocity_1h")}, warned
    assert all(x.get("feature") in (None, "velocity_1h") for x in warned), warned
    assert {x["role"] for x in warned} == {"live"}
    assert run(False) == []
    # a shadow model with a profile is judged on its own: the same warnings, as the shadow's
    both = run(True, shadow=True)
    assert {(x["event"], x["role"]) for x in both if x.get("feature") == "velocity_1h"} >= {
        ("feature drift", "live"), ("feature drift", "shadow"),
        ("missing rate jump", "live"), ("missing rate jump", "shadow")}, both


def test_counts_of_another_models_profile_are_not_mixed_and_a_swap_cannot_crash():
    # review finding: two models of the same features whose score bins differ in number;
    # adding one's batch counts to the other's stats or monitor raised a broadcast error
    # (the loop then died after committing the batch)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2000, 4)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] + rng.normal(size=2000) > 0).astype(int)
    X[:100, 1] = np.nan  # 5% missing: a rate over the rows counted, not all scored
    a = compile_model(xgb.train({"max_depth": 3, "objective": "binary:logistic"},
                                xgb.DMatrix(X, y), 20)).with_reference(X)
    b = compile_model(xgb.train({"max_depth": 1, "objective": "binary:logistic"},
                                xgb.DMatrix(X, y), 1)).with_reference(X)
    assert len(a.reference.score_edges) != len(b.reference.score_edges)

    def stats(m):
        s = BatchStats()
        r = m.score_batch(X)
        monitoring.count(m, X, r.score, s)
        s.account(r)
        return s

    total = BatchStats()
    total.add(stats(a))
    total.add(stats(b))  # b's counts replace a's, never added to them
    assert total.monitor["live"][2] is b.reference
    settings = Settings(source={"type": "file", "path": "x"}, model={"path": "x"})
    mon = monitoring.Monitor(b, settings, clock=lambda: 0.0)
    mon.add(stats(a))  # scored by a before the swap: not b's to judge
    assert mon.window.sum() == 0 and "feature_psi" not in mon.close()  # none counted
    mon.add(stats(b))
    w = mon.close()
    assert w["rows"] == 4000 and w["feature_psi"]["f0"] < 0.02
    assert w["missing_rate"]["f1"] == 0.05  # 100 of the 2,000 rows counted
    # one stats counted by a, then by b (a swap between two groups): b's counts replace
    # a's, never add to them
    s = BatchStats()
    monitoring.count(a, X, a.score_batch(X).score, s)
    monitoring.count(b, X, b.score_batch(X).score, s)
    assert s.monitor["live"][2] is b.reference
    assert s.monitor["live"][0].shape == b.reference.new_counts().shape
    assert int(s.monitor["live"][0][0, :b.reference.n_edges[0] + 2].sum()) == 2000


def test_a_busy_stream_ends_its_windows_on_time_without_an_idle_moment():
    m = _model(7)
    now = [0.0]
    settings = Settings(source={"type": "file", "path": "x"}, model={"path": "x"},
                        monitoring={"window_s": 10, "min_rows": 1})
    mon = monitoring.Monitor(m, settings, clock=lambda: now[0])
    X = np.random.default_rng(1).normal(size=(500, 7)).astype(np.float32)

    def batch():
        s = BatchStats()
        r = m.score_batch(X)
        monitoring.count(m, X, r.score, s)
        s.account(r)
        return s

    assert mon.add(batch()) is None and mon.last is None
    now[0] = 10.5
    judged = mon.add(batch())  # the next batch: the window before it is judged first
    assert judged is not None and judged["rows"] == 500 and mon.last is judged
    assert mon.window_rows == 500  # the batch is the new window's


def test_a_feature_without_reference_values_counts_each_value_out_of_range_once():
    X = np.random.default_rng(4).normal(size=(1000, 3)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int)
    ref = X.copy()
    ref[:, 2] = np.nan
    m = compile_model(xgb.train({"max_depth": 2, "objective": "binary:logistic"},
                                xgb.DMatrix(X, y), 5)).with_reference(ref)
    w = _window(m, X)
    assert w["out_of_range_rate"]["f2"] == 1.0 and w["missing_rate"]["f2"] == 0.0
    assert w["feature_psi"]["f2"] > 0.25


def test_serve_judges_its_requests_json_and_arrow_alike(tmp_path):
    from tests.test_serve import Server, get, post

    m = _model(7)
    path = tmp_path / "profiled.model"
    m.save(path)
    s = Server(path, tmp_path, {"monitoring": {"window_s": 1, "min_rows": 50},
                                "logging": {"format": "json"}})
    try:
        rng = np.random.default_rng(8)
        sent = []
        for i in range(12):
            X = rng.normal(size=(50, 7)).astype(np.float32)
            X[:, 2] = np.nan  # the feature turned null
            sent.append(X)
            if i % 2:
                t = pa.table({f"f{j}": pa.array(X[:, j]) for j in range(7)})
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, t.schema) as w:
                    w.write_table(t)
                status, _, out = post(s, "/v2/models/profiled/infer", sink.getvalue().to_pybytes(),
                                      {"Content-Type": "application/vnd.apache.arrow.stream"})
            else:
                body = json.dumps({"inputs": [{
                    "name": "x", "shape": [50, 7], "datatype": "FP32",
                    "data": [None if np.isnan(v) else float(v) for v in X.ravel()]}]})
                status, _, out = post(s, "/v2/models/profiled/infer", body.encode())
            assert status == 200, out
        time.sleep(1.6)  # no request: the window still ends on time (new-user finding)
        metrics = get(s, "/metrics")[1].decode()
    finally:
        assert s.stop() == 0, s.output()
    X = np.concatenate(sent)
    psis, missing, _ = _independent(m, X)

    def gauge(name, feature):
        pat = rf'^{name}{{feature="{feature}",role="live"}} (\S+)$'
        return float(re.search(pat, metrics, re.M).group(1))

    for j in range(7):
        assert abs(gauge("scoring_monitor_feature_psi", f"f{j}") - psis[j]) <= 1e-9
        assert gauge("scoring_monitor_feature_missing_rate", f"f{j}") == missing[j]
    assert gauge("scoring_monitor_feature_psi", "f2") > 0.25
    assert 'scoring_monitor_window_rows{role="live"} 600.0' in metrics
    assert "missing rate jump" in s.output() and '"feature": "f2"' in s.output()


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".arrow"])
def test_compile_takes_a_reference_file_and_refuses_one_without_the_features(tmp_path, suffix):
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(11)
    X = rng.normal(size=(500, 3)).astype(np.float32)
    b = xgb.train({"max_depth": 2, "objective": "binary:logistic"},
                  xgb.DMatrix(X, (X[:, 0] > 0).astype(int), feature_names=["a", "b", "c"]), 5)
    src = tmp_path / "m.json"
    b.save_model(src)
    ref = pa.table({"c": X[:, 2], "a": X[:, 0], "b": X[:, 1]})  # another column order
    path = tmp_path / f"ref{suffix}"
    if suffix == ".csv":
        pcsv.write_csv(ref, path)
    elif suffix == ".parquet":
        pq.write_table(ref, path)
    else:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, ref.schema) as w:
            w.write_table(ref)
    out = tmp_path / "m.model"
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "compile", str(src), "-o",
                           str(out), "--reference", str(path), "--bins", "5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = load_model(out).meta["reference"]
    assert doc["rows"] == 500 and doc["bins"] == 5
    # by name, not position: feature a's edges are a's quantiles
    want = np.unique(np.quantile(X[:, 0].astype(np.float64), [0.2, 0.4, 0.6, 0.8])
                     .astype(np.float32)).astype(np.float64).tolist()
    assert doc["features"][0]["edges"] == want
    bad = tmp_path / "bad.parquet"
    pq.write_table(ref.drop_columns(["b"]), bad)
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "compile", str(src), "-o",
                           str(tmp_path / "x.model"), "--reference", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "missing feature column(s): b" in proc.stderr, proc.stderr


@pytest.mark.kafka
def test_each_judged_window_lands_on_the_monitoring_topic_once(tmp_path, kafka_bootstrap,
                                                               topic_factory):
    import yaml

    import worker
    from tests import kafka_util as K
    from tests import models as TM

    ref = K.input_table(0, 5000, seed=1).drop_columns(["txn_id"])
    model = worker.compile_model(TM.xgboost_models()["xgb-binary-logistic"]).with_reference(ref)
    path = tmp_path / "profiled.model"
    model.save(path)
    topics = {k: topic_factory(partitions=2, prefix=k) for k in ("in", "out", "dlq", "mon")}
    rows = K.produce_inputs(kafka_bootstrap, topics["in"], n_messages=60, rows=50)
    cfg = K.write_config(tmp_path / "w.yaml", kafka_bootstrap, path, topics["in"],
                         topics["out"], topics["dlq"], group=f"g-{topics['in']}")
    doc = yaml.safe_load(cfg.read_text())
    doc["monitoring"] = {"window_s": 0.5, "min_rows": 1, "topic": topics["mon"]}
    cfg.write_text(yaml.safe_dump(doc))
    proc = K.start_worker(cfg, tmp_path / "worker.log")
    try:
        K.wait_for_ids(kafka_bootstrap, topics["out"], rows.num_rows)
        time.sleep(1.5)  # the last window ends while the loop is idle
    finally:
        rc = K.stop_worker(proc)
    assert rc == 0, (tmp_path / "worker.log").read_text()[-3000:]
    records = K.read_topic(kafka_bootstrap, topics["mon"], committed=False, idle=3.0)
    docs = [json.loads(m.value()) for m in records]
    assert docs and all(m.key() == model.model_id.encode() for m in records)
    assert sum(d["counted"] for d in docs) == rows.num_rows  # every row in one window
    p = model.reference
    for d in docs:  # each window's statistics are its own counts' (numpy, from the record)
        for j, name in enumerate(model.feature_names):
            c = d["counts"][name]
            a = np.array(c["bins"] + [c["missing"]], np.float64)
            e = np.append(p.fractions[j, :p.n_edges[j] + 1], p.fractions[j, p.n_edges[j] + 1])
            assert abs(d["feature_psi"][name] - _psi(a, e)) <= 1e-9
            assert d["missing_rate"][name] == c["missing"] / d["counted"]
        assert abs(d["score_psi"] - _psi(np.array(d["score_bins"], np.float64),
                                         p.score_fractions)) <= 1e-9
        assert d["role"] == "live" and d["start"] < d["end"]
    assert (tmp_path / "worker.log").read_text().count("window record") == 0


def test_a_monitoring_topic_without_a_kafka_sink_exits_2_naming_it(tmp_path):
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"source": {"type": "file", "path": str(tmp_path / "in")},
                                   "model": {"path": str(MODEL)},
                                   "monitoring": {"topic": "windows"}}))
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "--config", str(cfg)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "monitoring.topic: needs sink.type kafka" in proc.stderr, \
        proc.stderr


def test_a_renamed_category_shows_as_missing_and_drift():
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(12)
    names = ["grocery", "travel", "online", "fuel"]
    n = 4000

    def frame(renamed: bool):
        cats = rng.choice(names, n, p=[0.4, 0.1, 0.4, 0.1])
        if renamed:  # an upstream release calls "online" "e-commerce"
            cats = np.where(cats == "online", "e-commerce", cats)
        return pd.DataFrame({"amount": rng.gamma(2.0, 50.0, n).astype(np.float32),
                             "merchant": pd.Categorical(cats, categories=names
                                                        if not renamed else None)})

    ref = frame(False)
    y = ((ref["merchant"] == "online") & (ref["amount"] > 80)).astype(int)
    est = xgb.XGBClassifier(n_estimators=20, max_depth=3, enable_categorical=True,
                            tree_method="hist").fit(ref, y)
    m = compile_model(est).with_reference(ref)
    assert m.reference.n_edges[1] == len(names) - 1  # a bin a category

    def window(df):
        t = pa.Table.from_pandas(df.astype({"merchant": str}), preserve_index=False)
        settings = Settings(source={"type": "file", "path": "x"}, model={"path": "x"})
        mon = monitoring.Monitor(m, settings, clock=lambda: 0.0)
        stats = BatchStats()
        r = m.score_batch(t)
        monitoring.count(m, m.columns(t), r.score, stats)
        stats.account(r)
        mon.add(stats)
        return mon.close()

    clean, renamed = window(frame(False)), window(frame(True))
    assert clean["feature_psi"]["merchant"] < 0.02 and clean["missing_rate"]["merchant"] == 0
    assert renamed["feature_psi"]["merchant"] > 0.25
    assert 0.35 < renamed["missing_rate"]["merchant"] < 0.45  # "online"'s 40%: unknown
    assert renamed["feature_psi"]["amount"] < 0.02


def test_profile_options_are_checked_not_ignored(tmp_path):
    rng = np.random.default_rng(13)
    X = rng.normal(size=(300, 2)).astype(np.float32)
    b = xgb.train({"max_depth": 2, "objective": "binary:logistic"},
                  xgb.DMatrix(X, (X[:, 0] > 0).astype(int), feature_names=["a", "b"]), 3)
    src = tmp_path / "m.json"
    b.save_model(src)
    ref = tmp_path / "ref.csv"
    ref.write_text("a,b\n" + "\n".join(f"{x},{y}" for x, y in X.tolist()))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "worker.cli", *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    out = tmp_path / "m.model"
    for args, want in ((["--bins", "5"], "--bin describes the reference profile"),
                       (["--threshold", "0.7"], "--threshold describes the reference"),
                       (["--reference", ref, "--threshold", "0.9", "--threshold", "0.5"],
                        "finite and increasing"),
                       (["--reference", ref, "--threshold", "nan"], "finite and increasing")):
        proc = cli("compile", src, "-o", out, *args)
        assert proc.returncode == 2 and want in proc.stderr, (args, proc.stderr)
    proc = cli("compile", src, "-o", out, "--reference", ref)
    assert proc.returncode == 0 and "reference profile: 300 rows" in proc.stdout, proc.stdout
    proc = cli("profile", out, "--reference", ref, "-o", tmp_path / "p.model", "--threshold",
               "0.9", "--threshold", "0.5")
    assert proc.returncode == 2 and "finite and increasing" in proc.stderr, proc.stderr
    (tmp_path / "bad.csv").write_text("a\n" + "\n".join(str(x) for x in X[:, 0].tolist()))
    proc = cli("profile", out, "--reference", tmp_path / "bad.csv", "-o", tmp_path / "p.model")
    assert proc.returncode == 1 and "missing feature column(s): b" in proc.stderr and \
        "'missing" not in proc.stderr, proc.stderr


def test_a_model_without_a_profile_keeps_band_counts_and_says_so(tmp_path):
    from tests.test_hostile_runs import _message

    rec = _recording(tmp_path / "in.arrows", [_message(200, s, pa.array(
        np.arange(200 * s, 200 * s + 200, dtype=np.int64))) for s in range(3)])
    env = {**os.environ, "SCORING_WORKER__LOGGING__FORMAT": "json",
           "SCORING_WORKER__MONITORING__ENABLED": "true"}
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "replay", str(rec), "--model",
                           str(MODEL), "--output", str(tmp_path / "o.arrows")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    (said,) = [x for x in lines if "without a reference profile" in x["event"]]
    assert said["level"] == "warning"
    # and the bands are counted (the collector reads the worker's monitor)
    from worker.config import load_settings
    from worker.loop import Worker
    from worker.model.compiled import load_model as load

    settings = load_settings(None, source={"type": "file", "path": str(rec)},
                             sink={"type": "file", "path": str(tmp_path / "o2.arrows")},
                             model={"path": str(MODEL)})
    from worker.io import open_sink, open_source

    sink = open_sink(settings)
    w = Worker(settings, load(MODEL), open_source(settings), sink)
    assert w.run() == 0
    sink.close()
    from prometheus_client import generate_latest

    text = generate_latest(w.metrics.registry).decode()
    bands = re.findall(r'^scoring_monitor_band_rows_total{band="(\d)",role="live"} (\S+)$',
                       text, re.M)
    assert sum(float(n) for _, n in bands) == 600, text[-2000:]
    # and a histogram of the scores in tenths, equal to numpy's on the published scores
    got = dict(re.findall(r'^scoring_monitor_score_bin_rows_total{bin="(\d+)",role="live"} '
                          r'(\S+)$', text, re.M))
    from worker.io.records import read_records

    scores = np.concatenate([pa.ipc.open_stream(r.value).read_all().column("score")
                             .to_numpy() for r in read_records(tmp_path / "o2.arrows")])
    want = np.bincount(np.searchsorted(monitoring.DEFAULT_SCORE_EDGES, scores, side="right"),
                       minlength=10)
    assert [float(got[str(b)]) for b in range(10)] == want.tolist(), (got, want)


def test_a_new_profile_on_the_running_model_is_swapped_in(tmp_path):
    """The profile is outside the model id; the watcher still hands the artifact over (the
    same scores, judged against other data)."""
    from worker.config import load_settings
    from worker.lifecycle import ModelWatcher
    from worker.metrics import Metrics

    m = _model(7)
    plain = CompiledModel({k: v for k, v in m.meta.items() if k != "reference"}, m.arrays)
    path = tmp_path / "fraud.model"
    plain.save(path)
    settings = load_settings(None, model={"path": str(path), "reload": True,
                                          "reload_interval_ms": 50},
                             source={"type": "kafka", "topic": "in"},
                             sink={"type": "kafka", "topic": "out"})
    w = ModelWatcher(str(path), load_model(path), settings, Metrics()).start()
    try:
        m.save(path)
        deadline = time.monotonic() + 10
        while w._ready is None:
            assert time.monotonic() < deadline, "the profiled artifact was never taken"
            time.sleep(0.02)
        got = w.take()
        assert got.model_id == plain.model_id and got.reference is not None
    finally:
        w.stop()


def test_a_failing_monitor_never_costs_a_message(tmp_path, monkeypatch):
    """Monitoring that raises: every message is still scored and published, none
    dead-lettered, the failure counted once and monitoring stopped."""
    from tests.test_hostile_runs import _message
    from worker.config import load_settings
    from worker.io import open_sink, open_source
    from worker.io.records import read_records
    from worker.loop import Worker

    ref = demo.generate(2000, seed=1).select(demo.FEATURES)
    model = load_model(MODEL).with_reference(ref)
    rec = _recording(tmp_path / "in.arrows", [_message(100, s, pa.array(
        np.arange(100 * s, 100 * s + 100, dtype=np.int64))) for s in range(5)])
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("a monitoring bug")

    monkeypatch.setattr(monitoring, "count", broken)
    settings = load_settings(None, source={"type": "file", "path": str(rec)},
                             sink={"type": "file", "path": str(tmp_path / "o.arrows")},
                             model={"path": str(MODEL)}, delivery={"max_batch_messages": 1})
    sink = open_sink(settings)
    w = Worker(settings, model, open_source(settings), sink)
    assert w.run() == 0
    sink.close()
    assert len(list(read_records(tmp_path / "o.arrows"))) == 5
    assert not (tmp_path / "o-dlq.arrows").exists() or \
        not list(read_records(tmp_path / "o-dlq.arrows"))
    assert len(calls) == 1 and w.metrics.monitor_errors._value.get() == 1


def test_no_read_past_a_row_blocks_end():
    """Review finding: a block of n * nf values just under a chunk's width (one row of 9 to
    31 features not a multiple of 16) read up to 60 bytes past the array; blocks ending at
    an inaccessible page made that a SIGSEGV (exit -11) in the child."""
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "monitor_guard.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "counted 144 guarded blocks" in proc.stdout


def test_score_batch_monitor_a_new_users_findings(tmp_path):
    """New-user review: the same artifact loaded twice refused its own counts; threads' counts
    could not be judged together; monitor=True, a dict of single values and a reference
    without a column gave errors that did not say what to do."""
    m = _model(7)
    path = tmp_path / "m.model"
    m.save(path)
    a, b = load_model(path), load_model(path)
    X = _hostile(300, 7, [m.reference.edges[j, :m.reference.n_edges[j]] for j in range(7)],
                 seed=21)
    c = b.monitor_counts()
    a.score_batch(X[:100], monitor=c)  # the same model id and profile: its own counts
    b.score_batch(X[100:], monitor=c)
    np.testing.assert_array_equal(c.counts, _want(X, b.reference))
    bare = load_model(MODEL)
    with pytest.raises(ValueError, match="has no reference profile"):
        bare.score_batch(np.zeros((1, bare.n_features), np.float32), monitor=c)
    other = _model(16)
    with pytest.raises(ValueError, match="another model"):
        other.score_batch(np.zeros((1, 16), np.float32), monitor=c)
    # each thread its own counts, merged: the counts of all the rows
    parts = [a.monitor_counts() for _ in range(3)]
    for k, part in enumerate(parts):
        for i in range(k, 300, 3):
            a.score_batch(X[i:i + 1], monitor=part)
    parts[0].merge(parts[1])
    parts[0].merge(parts[2])
    np.testing.assert_array_equal(parts[0].counts, _want(X, a.reference))
    assert parts[0].figures()["counted"] == 300
    with pytest.raises(ValueError, match="same model"):
        parts[0].merge(other.monitor_counts())
    with pytest.raises(TypeError, match="monitor_counts"):
        a.score_batch(X[:1], monitor=True)
    with pytest.raises(TypeError, match="wrap each value in a list"):
        a.score_batch({f"f{j}": 0.5 for j in range(7)})
    with pytest.raises(KeyError, match="the reference"):
        a.with_reference({f"f{j}": np.zeros(200) for j in range(6)})


def test_score_batch_monitor_shared_by_threads_and_rolled_up_loses_no_row():
    """Hostile-review findings: one counts object shared by threads refused their calls after
    scoring, and a roll-up (merge, then reset) lost the rows added between the two. Threads
    now wait their turn, and merge(reset=True) moves the counts in one step."""
    import threading

    m = _model(7)
    p = m.reference
    X = _hostile(4000, 7, [p.edges[j, :p.n_edges[j]] for j in range(7)], seed=31)
    shared, rolled, total = m.monitor_counts(), m.monitor_counts(), m.monitor_counts()
    errors = []

    def work(k):
        try:
            for i in range(k, 4000, 4):
                rows = X[i:i + 1] if i % 8 else X[i:i + 1].astype(np.float64)
                m.score_batch(rows, monitor=shared)
                m.score_batch(rows, monitor=rolled)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):  # the roll-up, while the threads count
        total.merge(rolled, reset=True)
        total.figures()
    for t in threads:
        t.join()
    total.merge(rolled, reset=True)
    assert not errors, errors[:3]
    np.testing.assert_array_equal(shared.counts, _want(X, p))
    np.testing.assert_array_equal(total.counts, _want(X, p))
    assert rolled.rows == 0 and total.score_counts.sum() == 4000
    np.testing.assert_array_equal(total.score_counts, shared.score_counts)


def test_score_batch_monitor_refuses_what_is_not_counts_before_scoring():
    """Review finding: a class given as monitor= (its unbound add) crashed the process; an
    object with any add method was handed the scores. Refused before anything is scored."""
    m = _model(7)
    X = np.zeros((2, 7), np.float32)
    for bad in (type(m.monitor_counts()), _monitor.Counter, set(), object(), True):
        with pytest.raises(TypeError, match="monitor_counts"):
            m.score_batch(X, monitor=bad)
    plain = _monitor.Counter(m.reference.plan)
    with pytest.raises(TypeError):
        m.score_batch(X, monitor=plain)
    with pytest.raises(ValueError, match="another reference profile"):
        plain.merge(_monitor.Counter(_model(16).reference.plan))
    # a dict's other keys are the caller's (ignored, as frames' extra columns are)
    d = {f"f{j}": [0.5] for j in range(7)} | {"request_id": "abc", "note": None}
    np.testing.assert_array_equal(m.score_batch(d).score, m.score_batch(X[:1] + 0.5).score)


def test_a_counter_used_again_from_its_own_count_is_refused_not_deadlocked():
    m = _model(7)
    c = m.monitor_counts()
    Y = np.zeros((300, 7), np.float32)

    class Sneaky:
        def __array__(self, dtype=None, copy=None):
            c.add(np.zeros((1, 7), np.float32), np.zeros(1))
            return Y

    with pytest.raises(RuntimeError, match="used again"):
        c.add(Sneaky(), np.zeros(300))
    c.add(Y, np.zeros(300))  # and the counter still works
    assert c.rows == 300



@pytest.mark.parametrize("nf", [2048, 2049])
def test_a_counter_at_its_feature_bound_and_one_past_counts_as_numpy(nf):
    """FEW_FEATURES (2,048 padded features): at it a Counter keeps a few rows, one past it
    counts each call at once; both exact."""
    rng = np.random.default_rng(nf)
    edges = np.sort(rng.normal(size=(nf, 9)).astype(np.float32), axis=1)
    plan = _monitor.Plan(edges, np.full(nf, 9, np.int32), np.full(nf, -2, np.float32),
                         np.full(nf, 2, np.float32), np.zeros(0), 13)
    c = _monitor.Counter(plan)
    X = rng.normal(size=(7, nf)).astype(np.float32)
    X[0, :5] = np.nan
    for i in range(7):
        c.add(X[i:i + 1], np.zeros(1))
    assert c.npend == (7 if nf == 2048 else 0)
    want = np.stack([np.bincount(np.searchsorted(edges[j], X[~np.isnan(X[:, j]), j],
                                                 side="right"), minlength=10)
                     for j in range(nf)])
    got = c.counts
    np.testing.assert_array_equal(got[:, :10], want)
    np.testing.assert_array_equal(got[:, 10], np.isnan(X).sum(axis=0))


@pytest.mark.parametrize("m", [0, 1, 8, 9, 10, 17, 255])
def test_score_bins_equal_numpy_at_every_vector_tail(m):
    """The score's bins, counted 8 scores a vector and 9 edges a pass (a scalar bin a score
    took 7 ns), equal numpy's searchsorted for every row count around the vector's width
    and every pass's edge: NaN last, +-inf, -0.0 and scores exactly on edges."""
    rng = np.random.default_rng(m)
    edges = np.sort(np.concatenate([rng.normal(size=max(m - 2, 0)), [0.0, 0.0][:m]]))
    plan = _monitor.Plan(np.zeros((1, 1), np.float32), np.int32([1]), np.float32([-1]),
                         np.float32([1]), edges, 5)
    pool = np.concatenate([edges, [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e300, -1e300]])
    for n in [*range(41), 255, 256, 257, 1000, 1001]:
        score = np.where(rng.random(n) < 0.5, rng.choice(pool, n), rng.normal(size=n))
        counts, bins = np.zeros((1, 5), np.int64), np.zeros(m + 1, np.int64)
        plan.count(np.zeros((n, 1), np.float32), counts, score, bins)
        want = np.bincount(np.searchsorted(edges, score, side="right"), minlength=m + 1)
        np.testing.assert_array_equal(bins, want, err_msg=f"{n} scores")


def test_missing_counts_in_one_native_pass_equal_numpy():
    """The worker's per-feature missing counts of a float32 row block (numpy took 28 us for
    1,000 rows of 30 features); anything else is None, for numpy to count."""
    rng = np.random.default_rng(5)
    for n, nf in ((0, 5), (5, 0), (1, 1), (3, 31), (1000, 30), (4097, 1), (2, 4097)):
        X = rng.normal(size=(n, nf)).astype(np.float32)
        X[rng.random((n, nf)) < 0.3] = np.nan
        X[rng.random((n, nf)) < 0.1] = np.inf
        np.testing.assert_array_equal(_monitor.missing_counts(X), np.isnan(X).sum(axis=0))
    X = np.full((4, 6), np.nan, np.float32)
    for other in (X[:, ::2], X.astype(np.float64), X[0], X.reshape(2, 2, 6), [[1.0]], None):
        assert _monitor.missing_counts(other) is None
    from worker.formats.base import Gathered
    from worker.pipeline import missing_counts

    for block in (X, X.astype(np.float64), np.asfortranarray(X)):  # numpy's where not native
        g = Gathered(block, np.array([0, 4], np.int64), None, None)
        np.testing.assert_array_equal(missing_counts(g, list("abcdef")), [4] * 6)
