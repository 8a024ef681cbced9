"""One adapter per engine. Each exposes the same small surface the measurements use:

``supports(bm)``, ``set_threads(k)``, ``batch(X)`` (the timed call, whatever the library's
natural output is), ``proba(X)`` (positive-class probability, float64, for the answer check),
``one(row)`` (single-row call timed from Python) and ``load_snippet`` (Python that reloads the
model in a fresh process, for the memory footprint).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from models import CACHE, BenchModel


class Engine:
    name = "?"
    native_threads = True  # False: the library has no multi-threaded path for this model

    def supports(self, bm: BenchModel) -> bool:
        return True

    def prepare(self, bm: BenchModel) -> None:
        self.bm = bm

    def set_threads(self, k: int) -> None:
        self.threads = k


class Ours(Engine):
    name = "ours"

    def prepare(self, bm):
        import worker

        super().prepare(bm)
        t0 = time.perf_counter()
        self.model = worker.compile_model(bm.source)
        self.compile_seconds = time.perf_counter() - t0
        self.path = CACHE / f"ours_{bm.key}_{bm.fingerprint}.model"
        self.model.save(self.path)
        self.threads = 1

    def batch(self, X):
        return self.model.predict_proba(X, n_threads=self.threads)

    def proba(self, X):
        return self.model.predict_proba(X, n_threads=1)[:, 1]

    def one(self, row):
        return self.model.predict_proba(row, n_threads=1)

    def describe(self) -> str:
        m = self.model
        nb = m.forest.compact_node_bytes
        nodes = f", {nb}-byte nodes" if nb else ""
        return f"{m.layout} layout{nodes}, depth {m.depth or m.max_depth}, {m.n_trees} trees"

    def hot_bytes(self) -> int:
        """The bytes the batch walks read: nodes (8-byte compact nodes where in force), roots,
        leaf values."""
        a = self.model.arrays
        nodes = a["cnodes"].nbytes // 2 if self.model.forest.compact_node_bytes == 8 else \
            sum(a[k].nbytes for k in ("pnodes", "cnodes") if k in a)
        return int(nodes + sum(a[k].nbytes for k in ("root", "leaves") if k in a))

    @property
    def load_snippet(self):
        return ("import worker, numpy as np\n"
                f"m = worker.load_model({str(self.path)!r})\n"
                "run = lambda X: m.predict_proba(X, n_threads=1)\n")


class XGBoost(Engine):
    name = "xgboost"

    def supports(self, bm):
        return bm.library == "xgboost"

    def prepare(self, bm):
        super().prepare(bm)
        self.booster = bm.source
        self.path = CACHE / f"xgb_{bm.key}_{bm.fingerprint}.ubj"
        self.booster.save_model(self.path)
        self.set_threads(1)

    def set_threads(self, k):
        self.threads = k
        self.booster.set_param({"nthread": k})

    def batch(self, X):
        return self.booster.inplace_predict(X)

    def proba(self, X):
        return np.asarray(self.booster.inplace_predict(X), dtype=np.float64)

    def one(self, row):
        return self.booster.inplace_predict(row)

    @property
    def load_snippet(self):
        return ("import xgboost as xgb, numpy as np\n"
                f"b = xgb.Booster(model_file={str(self.path)!r}); b.set_param({{'nthread': 1}})\n"
                "run = lambda X: b.inplace_predict(X)\n")


class SKLearn(Engine):
    name = "sklearn"

    def supports(self, bm):
        return bm.library == "sklearn"

    def prepare(self, bm):
        import joblib

        super().prepare(bm)
        self.est = bm.source
        # GradientBoosting's predict has no threads of its own
        self.native_threads = hasattr(self.est, "n_jobs")
        self.path = CACHE / f"sk_{bm.key}_{bm.fingerprint}.joblib"
        if not self.path.exists():
            joblib.dump(self.est, self.path)
        self.set_threads(1)

    def set_threads(self, k):
        self.threads = k
        if hasattr(self.est, "n_jobs"):
            self.est.n_jobs = k

    def batch(self, X):
        return self.est.predict_proba(X)

    def proba(self, X):
        return self.est.predict_proba(X)[:, 1]

    def one(self, row):
        return self.est.predict_proba(row)

    @property
    def load_snippet(self):
        return ("import joblib, numpy as np, sklearn.ensemble\n"
                f"e = joblib.load({str(self.path)!r})\n"
                "if hasattr(e, 'n_jobs'): e.n_jobs = 1\n"
                "run = lambda X: e.predict_proba(X)\n")


class TL2cgen(Engine):
    name = "tl2cgen"

    def prepare(self, bm):
        import tl2cgen
        import treelite

        super().prepare(bm)
        self.path = CACHE / f"tl2cgen_{bm.key}_{bm.fingerprint}.so"
        self.compile_seconds = 0.0
        if not self.path.exists():
            if bm.library == "xgboost":
                tm = treelite.frontend.from_xgboost(bm.source)
            else:
                tm = treelite.sklearn.import_model(bm.source)
            t0 = time.perf_counter()
            tmp = self.path.with_suffix(".tmp.so")
            tl2cgen.export_lib(tm, toolchain="gcc", libpath=str(tmp),
                               params={"parallel_comp": 8}, nthread=2, verbose=False)
            tmp.rename(self.path)
            self.compile_seconds = time.perf_counter() - t0
        self._predictors = {}
        self.set_threads(1)

    def set_threads(self, k):
        import tl2cgen

        self.threads = k
        if k not in self._predictors:
            self._predictors[k] = tl2cgen.Predictor(str(self.path), nthread=k)
        self.predictor = self._predictors[k]
        self._dm_cache = (None, None)

    def _dmatrix(self, X):
        import tl2cgen

        # batch timing excludes building the DMatrix (a zero-copy wrapper of the numpy array)
        if self._dm_cache[0] is not X:
            self._dm_cache = (X, tl2cgen.DMatrix(X))
        return self._dm_cache[1]

    def batch(self, X):
        return self.predictor.predict(self._dmatrix(X))

    def proba(self, X):
        import tl2cgen

        out = self._predictors[1].predict(tl2cgen.DMatrix(X))
        return np.asarray(out, dtype=np.float64).reshape(X.shape[0], -1)[:, -1]

    def one(self, row):
        import tl2cgen

        return self.predictor.predict(tl2cgen.DMatrix(row))

    @property
    def load_snippet(self):
        return ("import tl2cgen, numpy as np\n"
                f"p = tl2cgen.Predictor({str(self.path)!r}, nthread=1)\n"
                "run = lambda X: p.predict(tl2cgen.DMatrix(X))\n")


ENGINES = [Ours, XGBoost, SKLearn, TL2cgen]


def so_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
