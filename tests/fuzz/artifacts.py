"""Hostile model artifacts: valid artifacts of each layout, mutated (array values, shapes, meta
fields, header specs, raw header bytes) and resealed with a fresh checksum, so that only the
structural check stands between them and the kernels. Each must be refused with an
ArtifactError at load, or load and then score hostile rows on every path (one row, a block,
Arrow columns, lazy policies) without a crash or a hang.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from functools import cache

import numpy as np
from hypothesis import strategies as st

from worker.model import artifact

_U32 = [0, 1, 2, 0x7F800000, 0xFF800000, 0x7FC00000, 0x80000000, 0x80000001, 0x7FFFFFFF,
        0xFFFFFFFF, 27, 28, 29, 30, 31,
        # special nodes: the key flag, entry headers (zero band, huge, flags)
        0x40000000, 0x40000001, 0xC0000000, 0x001FFFFF, 0x00100000, 0x20000040, 0x80000020]
_I64 = [-(2**63), -2, -1, 0, 1, 2, 7, 8, 100, 2**31, 2**62]
_I32 = [-(2**31), -2, -1, 0, 1, 2, 3, 2**31 - 1]
_F = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e308, -1e308, 3.4e38]
_META = ["task", "link", "n_outputs", "n_features", "feature_names", "classes", "divisor",
         "layout", "depth", "max_depth", "accumulate", "objective", "source", "kind", "notes",
         "layout_choice", "category_hashes", "aggregate"]
_META_VALUES = [None, -1, 0, 1, 2, 3, 20, 21, 31, 32, 63, 64, 2**40, -(2**40), 1.5, float("nan"),
                "padded", "compact", "softmax", "vote", "sigmoid", "multiclass", "regression",
                "float32", "float64", "", [], ["a"], {}, True, "min", "max", "sum", "median",
                # the compile's layout choice, naming a kernel the model may not take
                {"layout": "padded", "kernel": "quickscorer"},
                {"layout": "compact", "kernel": "quickscorer"},
                {"layout": "compact", "kernel": "walk", "us_per_row": {"x": "fast"}},
                {"layout": "padded", "kernel": "walk", "not_candidates": [1]},
                {"layout": "padded", "kernel": "oblivious"},
                {"layout": "compact", "kernel": "oblivious"},
                # CatBoost's hashed categories: features, hashes at the edges
                {"f0": [0]}, {"f1": [0xFFFFFFFF, 1]}, {"c0": [2**32]}, {"c0": [-1]},
                {"c0": []}, {"c0": [7, 7]}, {"c0": list(range(70000))}, {"x0": [1.5]}]


@cache
def bases() -> dict[str, bytes]:
    """Valid artifacts: the golden XGBoost model (padded, float32, binary), a deep random
    forest (compact, vote), a multiclass XGBoost model (softmax, tree groups), a LightGBM
    model with categorical and zero-as-missing splits (special nodes, ``cats``), and two that
    load with QuickScorer tables: a compact LightGBM model with staged categorical splits and
    a padded XGBoost model with partition splits; and two that load with the oblivious kernel:
    a CatBoost model (numeric) and one with one-hot categorical features (special nodes as
    the kernel's derived columns, hashed categories in the meta); and an ONNX regressor whose
    trees aggregate by MAX (meta.aggregate)."""
    import lightgbm as lgb
    import xgboost as xgb
    from sklearn.ensemble import RandomForestClassifier

    import worker

    from .runner import GOLDEN_MODEL

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    y = (np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) > 0).astype(int)
    rf = RandomForestClassifier(n_estimators=20, max_depth=14, random_state=0).fit(
        np.nan_to_num(X), y + (X[:, 2] > 1))
    y3 = y + (np.nan_to_num(X[:, 2]) > 1)
    mc = xgb.train({"objective": "multi:softprob", "num_class": 3, "max_depth": 3},
                   xgb.DMatrix(X, label=y3), 6)
    Xc = X.copy()
    Xc[:, 4] = rng.integers(0, 40, X.shape[0])
    Xc[rng.random(X.shape[0]) < 0.3, 1] = 0.0
    lg = lgb.train({"objective": "binary", "num_leaves": 8, "zero_as_missing": True,
                    "min_data_per_group": 5, "cat_smooth": 1.0, "verbose": -1},
                   lgb.Dataset(Xc, (np.nan_to_num(Xc[:, 0]) + (Xc[:, 4] % 3 == 0) > 0.5)
                               .astype(int), categorical_feature=[4]), 8)
    lq = lgb.train({"objective": "binary", "num_leaves": 12, "min_data_per_group": 5,
                    "cat_smooth": 1.0, "verbose": -1},
                   lgb.Dataset(Xc, (np.nan_to_num(Xc[:, 0]) + (Xc[:, 4] % 3 == 0) > 0.5)
                               .astype(int), categorical_feature=[4]), 8)
    xc = xgb.DMatrix(Xc, label=y, enable_categorical=True,
                     feature_types=["q", "q", "q", "q", "c", "q"])
    xq = xgb.train({"objective": "binary:logistic", "max_depth": 4, "tree_method": "hist",
                    "max_cat_to_onehot": 1}, xc, 6)
    qs = {"lightgbm-quickscorer": worker.compile_model(lq, layout="compact",
                                                       kernel="quickscorer"),
          "xgb-categorical-quickscorer": worker.compile_model(xq, kernel="quickscorer")}
    with contextlib.suppress(ImportError):  # without catboost or clickhouse-cityhash
        qs.update(_catboost_bases(X, y))
    with contextlib.suppress(ImportError):  # without onnx and onnxmltools
        qs["onnx-max"] = _onnx_max_base(X)
    return {
        **{k: m.to_bytes() for k, m in qs.items()},
        "lightgbm-categorical": worker.compile_model(lg).to_bytes(),
        "golden": GOLDEN_MODEL.read_bytes(),
        "rf-compact": worker.compile_model(rf, layout="compact").to_bytes(),
        "xgb-multi": worker.compile_model(mc).to_bytes(),
    }


def _catboost_bases(X: np.ndarray, y: np.ndarray) -> dict:
    import catboost
    import pandas as pd

    import worker

    kw = dict(iterations=8, verbose=0, thread_count=1, allow_writing_files=False,
              random_seed=0)
    numeric = catboost.CatBoostClassifier(depth=5, **kw).fit(X, y)
    df = pd.DataFrame({f"x{j}": X[:, j] for j in range(4)})
    df["c0"] = np.where(X[:, 4] > 0, "a", np.where(X[:, 4] < -1, "b", "c"))
    df["c1"] = (np.nan_to_num(X[:, 5]) * 3).astype(int) % 5
    onehot = catboost.CatBoostClassifier(depth=4, one_hot_max_size=255,
                                         cat_features=["c0", "c1"], **kw).fit(df, y)
    return {"catboost-oblivious": worker.compile_model(numeric, kernel="oblivious"),
            "catboost-onehot-oblivious": worker.compile_model(onehot, kernel="oblivious")}


def _onnx_max_base(X: np.ndarray):
    """An XGBoost regressor exported to ONNX with aggregate_function MAX (meta.aggregate)."""
    import xgboost as xgb
    from onnx import helper
    from onnxmltools import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    import worker

    m = convert_xgboost(xgb.XGBRegressor(n_estimators=6, max_depth=3).fit(
        X, np.nan_to_num(X[:, 0])), initial_types=[("input", FloatTensorType([None, 6]))])
    node = next(n for n in m.graph.node if n.op_type == "TreeEnsembleRegressor")
    for a in [a for a in node.attribute if a.name == "aggregate_function"]:
        node.attribute.remove(a)
    node.attribute.append(helper.make_attribute("aggregate_function", "MAX"))
    return worker.compile_model(m)


def _split(data: bytes) -> tuple[dict, bytes]:
    start = len(artifact.MAGIC) + 12
    _version, hlen = struct.unpack_from("<IQ", data, len(artifact.MAGIC))
    return json.loads(data[start:start + hlen]), data[start + hlen:-32]


def _join(header: dict | bytes, payload: bytes) -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header, sort_keys=True).encode()
    body = artifact.MAGIC + struct.pack("<IQ", artifact.FORMAT_VERSION, len(h)) + h + payload
    return body + hashlib.sha256(body).digest()  # resealed: the checksum proves nothing


@st.composite
def cases(draw) -> tuple[bytes, str]:
    name = draw(st.sampled_from(sorted(bases())))
    data = bases()[name]
    meta, arrays, _ = artifact.loads(data)
    arrays = {k: v.copy() for k, v in arrays.items()}
    kind = draw(st.sampled_from(["value", "value", "value", "values", "shape", "meta", "spec",
                                 "header_bytes", "none"]))
    what = f"{name}: {kind}"
    if kind in ("value", "values"):
        key = draw(st.sampled_from(sorted(arrays)))
        a = arrays[key]
        if a.size == 0:
            return data, what + f" {key} (empty)"
        flat = a.reshape(-1)
        pool = {"u": _U32, "i": _I64 if a.dtype.itemsize == 8 else _I32}.get(a.dtype.kind, _F)
        n = 1 if kind == "value" else draw(st.integers(2, 16))
        for _ in range(n):
            i = draw(st.integers(0, flat.size - 1))
            if a.ndim == 2 and a.shape[1] == 4 and draw(st.booleans()):
                i -= i % 4  # a compact node's key ...
                i += draw(st.sampled_from([0, 1, 2, 3]))  # ... or threshold, child, leaf
            v = draw(st.sampled_from(pool + [flat.size - 1, flat.size, a.shape[0]]))
            flat[i] = np.array(v).astype(a.dtype) if a.dtype.kind != "u" else np.uint32(
                int(v) & 0xFFFFFFFF)
        what += f" {key} x{n}"
        return artifact.dumps(meta, arrays), what
    if kind == "shape":
        key = draw(st.sampled_from(sorted(arrays)))
        a = arrays[key]
        k = draw(st.sampled_from([-3, -1, 1, 2]))
        arrays[key] = a[:max(a.shape[0] + k, 0)] if k < 0 else np.concatenate(
            [a, np.zeros((k,) + a.shape[1:], dtype=a.dtype)])
        return artifact.dumps(meta, arrays), what + f" {key} {k:+d} rows"
    if kind == "meta":
        key = draw(st.sampled_from(_META))
        if draw(st.integers(0, 5)) == 0:
            meta.pop(key, None)
            return artifact.dumps(meta, arrays), what + f" drop {key}"
        meta[key] = draw(st.sampled_from(_META_VALUES))
        return artifact.dumps(meta, arrays), what + f" {key}={meta[key]!r}"
    header, payload = _split(data)
    if kind == "spec":
        spec = draw(st.sampled_from(header["arrays"]))
        field = draw(st.sampled_from(["shape", "offset", "nbytes", "dtype", "name"]))
        value = draw(st.sampled_from([
            -1, 0, 8, 2**62, "x", None, [], [0], [2**31, 2**31], [-1, 2], [1, 1, 1], "<f8",
            "<u4", "|O", "tree_group", "root", "leaves", 1.5, True]))
        spec[field] = value
        return _join(header, payload), what + f" {spec.get('name')}.{field}={value!r}"
    if kind == "header_bytes":
        h = bytearray(json.dumps(header, sort_keys=True).encode())
        for b in draw(st.lists(st.integers(0, len(h) * 8 - 1), min_size=1, max_size=4)):
            h[b >> 3] ^= 1 << (b & 7)
        return _join(bytes(h), payload), what
    return data, what


def hostile_rows(n_features: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=3.0, size=(n, n_features)).astype(np.float32)
    pick = rng.random(X.shape)
    X[pick < 0.1] = np.nan
    X[(pick >= 0.1) & (pick < 0.15)] = np.inf
    X[(pick >= 0.15) & (pick < 0.2)] = -np.inf
    X[(pick >= 0.2) & (pick < 0.25)] = 0.0
    X[(pick >= 0.25) & (pick < 0.27)] = np.finfo(np.float32).max
    return X


def check(data: bytes, path) -> str:
    """Load (refused: 'refused'), else score every way; an exception other than
    ArtifactError at load breaks the contract."""
    import pyarrow as pa

    import worker

    path.write_bytes(data)
    try:
        model = worker.load_model(path)
    except worker.ArtifactError:
        return "refused"
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"load raised {type(exc).__name__}, not ArtifactError: {exc}") \
            from None
    X = hostile_rows(model.n_features, 70, seed=1)
    model.raw(X[:1], n_threads=1)
    model.raw(X, n_threads=2)
    # one task of 600 rows: the rows walk of deep forests (kernels.ROWS_WALK_MIN: 256 rows)
    model.raw(hostile_rows(model.n_features, 600, seed=2), n_threads=1)
    model.raw(pa.table({n: X[:, j] for j, n in enumerate(model.feature_names)}), n_threads=1)
    if "x_tree" in model.arrays and model.aggregate == "sum":  # node covers: attributions
        for method in ("treeshap", "path"):
            model.contributions(X, method, n_threads=2)
    policies = ["certified", "lazyrf" if model.link == "vote" else "lazygbm"]
    for lazy in policies:
        try:
            model.score_batch(X, lazy=lazy, thresholds=[0.5], n_threads=1)
        except (ValueError, TypeError) as exc:  # a policy that does not apply says so
            return f"loaded, {lazy}: {type(exc).__name__}"
    return "loaded"


def check_factory(state):
    bases()
    path = state / "case.model"

    def run(data: bytes, what: str, i: int) -> str:
        return check(data, path)

    return run
