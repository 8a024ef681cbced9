"""CompiledModel: the packed model plus the numpy-side API (docs/models.md: Python API)."""

from __future__ import annotations

import numpy as np

from .. import _kernels
from . import artifact, reference, structure
from .lazy import Target, audit_mask, score_lazy
from .result import MAX_THRESHOLDS, ScoreResult, _sorted, decisions, default_threads

_META_KEYS = ("task", "link", "n_outputs", "n_features", "feature_names", "classes", "divisor",
              "objective", "source", "kind", "layout", "depth", "max_depth", "accumulate",
              "notes")


_L = _kernels.Link
_LINKS = {"sigmoid": int(_L.LINK_SIGMOID), "sigmoid2": int(_L.LINK_SIGMOID2),
          "softmax": int(_L.LINK_SOFTMAX), "softmax_zero": int(_L.LINK_SOFTMAX_ZERO)}
_LINK_NONE, _LINK_COPY, _LINK_VOTE1 = int(_L.LINK_NONE), int(_L.LINK_COPY), int(_L.LINK_VOTE1)
_SMALL = 64  # rows up to one kernel block take Forest.small (GIL held, no threads)


class CompiledModel:
    """A compiled tree ensemble. Build with ``worker.compile_model`` or ``worker.load_model``."""

    def __init__(self, meta: dict, arrays: dict[str, np.ndarray], model_id: str | None = None,
                 kernel: str = "auto"):
        structure.check(meta, arrays)  # nothing native reads an array before this passes
        self.meta = dict(meta)
        self.arrays = arrays
        for key in _META_KEYS:
            setattr(self, key, self.meta[key])
        self.classes = list(self.classes)
        self._classes_arr = np.asarray(self.classes) if self.classes else None
        self.feature_names = list(self.feature_names)
        # feature name -> categories in code order (string inputs are mapped through it)
        self.categories = dict(self.meta.get("categories") or {})
        # feature name -> the hashes of its categories in code order (CatBoost: model/cathash)
        self.category_hashes = dict(self.meta.get("category_hashes") or {})
        self._category_sets = category_sets(self.categories, self.category_hashes) \
            if self.categories or self.category_hashes else {}
        self._numeric_columns = np.asarray([j for j, f in enumerate(self.feature_names)
                                            if f not in self.category_hashes], dtype=np.intp)
        self.work_total = int(arrays["unit_ptr"].shape[0] - 1)
        self.n_trees = int(arrays["tree_group"].shape[0])
        # the kernel measured fastest when the model was compiled (meta.layout_choice, checked
        # by structure.check); an artifact without that record measures at load
        self.layout_choice = dict(self.meta.get(artifact.MEASURED) or {})
        stored = self.layout_choice.get("kernel", "auto") if kernel == "auto" else kernel
        args = (arrays, self.layout, int(self.depth), int(self.n_features),
                int(self.n_outputs), float(self.divisor))
        self._kernel_note = ""
        # "sum", or ONNX Runtime's MIN / MAX aggregation (kernels: ModelView.agg)
        self.aggregate = str(self.meta.get("aggregate", "sum"))
        try:
            self.forest = _kernels.Forest(*args, stored, self.aggregate)
        except ValueError as exc:
            if kernel != "auto" or not str(exc).startswith(f"kernel {stored}: "):
                raise
            # stored by a build whose QuickScorer took more than this one's does, or an
            # oblivious kernel named for a model that is not: the walks
            self.forest = _kernels.Forest(*args, "walk", self.aggregate)
            self._kernel_note = f"the stored choice, {stored}, is refused: {exc}"
        # what the stopping policies read (model/lazy.py), and the tables they build once
        self.lazy_target = Target(self.forest, self.arrays, self.link, self.task, self.kind,
                                  int(self.n_outputs), len(self.classes), self.n_trees,
                                  self.work_total, self.score_from_raw)
        self._explainer = None  # _explain.Explainer, built on the first attribution
        self.model_id = model_id or artifact.dumps_with_id(self.meta, self.arrays)[1]
        # flight monitoring's reference profile (model/reference.py), checked here: None
        # when the artifact carries none
        self.reference = reference.Profile.from_meta(self.meta, self.feature_names)
        # predict_proba's link code, for numpy rows that go to the kernels as they are (no
        # hashed categories); None: through the general path, which raises where it must
        try:
            self._proba_link = None if self.category_hashes else self._link_code()
        except AttributeError:
            self._proba_link = None

    def with_reference(self, X, bins: int = reference.DEFAULT_BINS,
                       thresholds=(0.5,)) -> CompiledModel:
        """This model with a reference profile of rows ``X`` (the same model id)."""
        doc = reference.build(self, X, bins, thresholds)
        m = CompiledModel({**self.meta, reference.REFERENCE: doc}, self.arrays,
                          self.model_id, "auto")
        return m

    def monitor_counts(self):
        """Flight monitoring's counts for ``score_batch(X, monitor=...)`` (worker.model.
        reference.Counts: ``figures()`` judges them against this model's reference profile)."""
        if self.reference is None:
            raise ValueError("the model has no reference profile: compile it with one "
                             "(compile_model(src, reference=X), scoring-worker compile "
                             "--reference, or model.with_reference(X) on this model)")
        return reference.Counts(self.reference.plan, self)

    @property
    def kernel(self) -> str:
        """The full-evaluation kernel scoring this model: "quickscorer" or "masks" (models
        whose trees have at most 64 leaves; masks: one score summed, AVX-512F and CD),
        "oblivious" (padded models asking one question per level, CatBoost's), "lanes"
        (padded trees of depth 5 or less, AVX-512F) or "walk", as measured fastest when
        compiled. All give the same scores bit for bit."""
        return self.forest.kernel

    @property
    def kernel_choice(self) -> dict:
        """How the layout and kernel were chosen. Compiled by this version: ``by`` (measured,
        default, only candidate, forced), each candidate's microseconds per probe row on the
        compiling ``machine``, and ``not_candidates`` with the reason each was not one. An
        older artifact: the kernel measured at load (``us_per_row`` on this machine) and the
        reason the other was not taken."""
        c = self.layout_choice
        reason = self._kernel_note or self.forest.kernel_reason
        if not reason and self.forest.kernel == "walk" and c:
            # why this layout's QuickScorer was not taken: not a candidate, or slower
            refused = (c.get("not_candidates") or {}).get(f"{self.layout} quickscorer")
            timed = f"{self.layout} quickscorer" in (c.get("us_per_row") or {})
            reason = refused or ("measured slower on probe rows" if timed else "")
        out = {"layout": self.layout, "kernel": self.forest.kernel,
               "by": c.get("by", "measured at load" if self.forest.kernel_timings else "rule"),
               "reason": reason,
               "us_per_row": dict(c.get("us_per_row") or self.forest.kernel_timings)}
        for key in ("not_candidates", "machine", "probe_rows"):
            if key in c:
                out[key] = c[key]
        return out

    # ---- persistence -------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return artifact.dumps(self.meta, self.arrays)

    def save(self, path) -> str:
        """Write the data-only artifact; returns the model id (sha256 of its content)."""
        return artifact.save(path, self.meta, self.arrays)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    # ---- inputs ------------------------------------------------------------------------
    def by_name(self, X):
        """A pandas DataFrame or a dict of columns as a pyarrow Table, so its features are
        matched by name (never by position) and its category columns read by their names;
        anything else as it is (numpy is positional: the model's feature order)."""
        return named_table(X, self.feature_names, set(self.categories),
                           frozenset(self.category_hashes))

    def hashed_rows(self, X):
        """Rows of a model with hashed categories (CatBoost's, model/cathash) from numpy (or
        anything numpy reads: a pandas frame, lists): float32 with each categorical value
        replaced by its code (strings and whole numbers hashed, as CatBoost does). Anything
        else, and every other model's input, is returned as it is."""
        if type(X) is _HashedRows:  # hashed already (score_batch with a monitor)
            return X.view(np.ndarray)
        X = self.by_name(X)
        if not self.category_hashes or isinstance(X, _kernels.Columns) or (
                hasattr(X, "schema") and hasattr(X, "column")):
            return X
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            return X  # refused, with the shape, where it is read
        out = np.empty(X.shape, dtype=np.float32)
        numeric = self._numeric_columns
        out[:, numeric] = X[:, numeric].astype(np.float32)  # one cast for them all
        for j, name in enumerate(self.feature_names):
            if name not in self.category_hashes:
                continue
            col = X[:, j]
            hashes = self._category_sets[name]
            if col.dtype == object:
                out[:, j] = hashes.codes_of_objects(col)
            elif col.dtype.kind in "iufb":
                out[:, j] = hashes.codes_of_numbers(col)
            elif col.dtype.kind in "US":
                out[:, j] = hashes.codes_of_objects(col.tolist())
            else:
                raise TypeError(f"feature {name!r}: {col.dtype} values are not CatBoost "
                                "categories (strings or whole numbers)")
        return out

    def columns(self, X):
        """Column descriptors for numpy (any dtype/order) or a pyarrow Table/RecordBatch."""
        return self._columns(self.hashed_rows(X))

    def _columns(self, X):
        """``columns`` of rows whose categorical values are codes already (``hashed_rows``)."""
        if isinstance(X, _kernels.Columns):
            return X
        if hasattr(X, "schema") and hasattr(X, "column"):
            return arrow_columns(X, self.feature_names, self._category_sets)
        X = np.asarray(X)
        if X.dtype.kind not in "biuf":
            numbers_only(X)
        cols = _kernels.Columns.from_numpy(X)
        if cols.n_features != self.n_features:
            raise ValueError(f"X has {cols.n_features} features, the model expects "
                             f"{self.n_features}")
        return cols

    # ---- predictions -------------------------------------------------------------------
    def raw(self, X, n_threads: int | None = None) -> np.ndarray:
        """Raw scores (n, n_outputs) float64 (margins; averaged votes for forests)."""
        if type(X) is np.ndarray and not self.category_hashes:  # hashed_rows: X as it is
            return self._raw(X, n_threads)
        return self._raw(self.hashed_rows(X), n_threads)

    def _raw(self, X, n_threads: int | None = None) -> np.ndarray:
        """``raw`` of rows whose categorical values are codes already (``hashed_rows``)."""
        if type(X) is np.ndarray and X.ndim == 2 and X.shape[0] <= _SMALL:
            out = self.forest.small(X, _LINK_NONE)  # None: not a fast-path layout
            if out is not None:
                return out
        return self.forest.raw(self._columns(X), n_threads or default_threads())

    def predict_margin(self, X, n_threads: int | None = None) -> np.ndarray:
        raw = self.raw(X, n_threads)
        return raw[:, 0] if self.n_outputs == 1 else raw

    def _link_code(self) -> int:
        """The kernels' code for this model's link (raises for models without probabilities)."""
        if self.task == "regression":
            raise AttributeError("predict_proba is for classifiers; this model is a regressor")
        if self.link == "vote":
            return _LINK_COPY if self.n_outputs > 1 else _LINK_VOTE1
        if self.link in _LINKS:
            return _LINKS[self.link]
        # identity-link binary (binary:logitraw): the margin is not a probability
        raise AttributeError(f"objective {self.objective} gives margins, not probabilities")

    def proba_from_raw(self, raw: np.ndarray, n_threads: int = 1) -> np.ndarray:
        # the link runs in C (libm exp) for every batch size: a row's probability is the same
        # to the bit whether it came alone (predict_proba fast path) or in a batch
        return _kernels.link_proba(np.ascontiguousarray(raw, dtype=np.float64),
                                   self._link_code(), n_threads)

    def predict_proba(self, X, n_threads: int | None = None) -> np.ndarray:
        # a few rows of a numpy array: one call into C, no staging, no per-call allocation
        # beyond the result; without hashed categories before hashed_rows and by_name, which
        # return numpy rows as they are (bench/one_row.py times each piece)
        if self._proba_link is not None:  # small() takes numpy rows only, else None
            out = self.forest.small(X, self._proba_link)
            if out is not None:
                return out
        X = self.hashed_rows(X)
        if type(X) is np.ndarray and X.ndim == 2 and X.shape[0] <= _SMALL:
            out = self.forest.small(X, self._link_code())
            if out is not None:
                return out
        n_threads = n_threads or default_threads()
        return self.proba_from_raw(self._raw(X, n_threads), n_threads)

    def predict(self, X, n_threads: int | None = None) -> np.ndarray:
        raw = self.raw(X, n_threads)
        if self.task == "regression":
            return self.value_from_raw(raw)
        if self.link == "identity":  # binary:logitraw: XGBoost's label is margin > 0
            return self._classes_arr[(raw[:, 0] > 0).astype(np.intp)]
        return self._classes_arr[np.argmax(self.proba_from_raw(raw), axis=1)]

    def value_from_raw(self, raw: np.ndarray) -> np.ndarray:
        if self.link == "sigmoid":  # reg:logistic, LightGBM cross_entropy
            return 1.0 / (1.0 + np.exp(-raw[:, 0]))
        if self.link == "exp":  # LightGBM poisson, gamma, tweedie: a log link
            return np.exp(raw[:, 0])
        if self.link == "probit":  # ONNX Runtime's PROBIT on one target (cyext/probit.h)
            return _kernels.ort_probit(np.ascontiguousarray(raw[:, 0], dtype=np.float64))
        return raw[:, 0]

    @property
    def scores_probabilities(self) -> bool:
        """Its scores are probabilities, 0 to 1: a classifier's (but margins:
        binary:logitraw), and a regression's through a sigmoid (reg:logistic, LightGBM's
        cross_entropy)."""
        return self.link == "sigmoid" or self.task != "regression" and self.link != "identity"

    def threshold_problem(self, thresholds) -> str | None:
        """Why ``thresholds`` cannot band this model's scores (None: they can): for scores
        that are probabilities, a threshold outside 0 to 1 (above 1 never reached, below 0
        always; a hostile review's thresholds [50, 90], percentages, passed every row); more
        than MAX_THRESHOLDS (a decision is an 8-bit band index: 200 thresholds gave bands of
        -56)."""
        t = _sorted(tuple(thresholds))
        if len(t) > MAX_THRESHOLDS:
            return (f"{len(t)} thresholds, more than {MAX_THRESHOLDS} (a decision is a band "
                    "index of 8 bits)")
        if not len(t) or not self.scores_probabilities or (t[0] >= 0.0 and t[-1] <= 1.0):
            return None
        odd = next(float(v) for v in t if not 0.0 <= v <= 1.0)
        return (f"{odd:g} is outside 0 to 1, and the model's scores are probabilities: a "
                f"threshold above 1 is never reached, one below 0 always is (a percentage: "
                f"divide it by 100)")

    def score_from_raw(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(score, label index) as in the output: P(positive), P(label), or the regression
        value."""
        n = raw.shape[0]
        if self.task == "regression":
            return self.value_from_raw(raw), np.full(n, -1, dtype=np.int32)
        if self.link == "identity":
            m = raw[:, 0]
            return m, (m > 0).astype(np.int32)
        proba = self.proba_from_raw(raw)
        if self.task == "binary":
            return proba[:, 1], (proba[:, 1] > proba[:, 0]).astype(np.int32)
        idx = np.argmax(proba, axis=1)
        return proba[np.arange(n), idx], idx.astype(np.int32)

    # ---- attributions ------------------------------------------------------------------
    def contributions(self, X, method: str = "treeshap",
                      n_threads: int | None = None) -> np.ndarray:
        """Per-feature attributions in the margin space (log-odds for binary XGBoost, the
        averaged vote for forests), the bias last: (n, n_features + 1), or (n, n_outputs,
        n_features + 1) for several outputs. Each row's attributions plus its bias are its
        raw score. ``method``: ``treeshap`` (exact path-dependent TreeSHAP) or ``path``
        (Saabas: XGBoost's ``approx_contribs``)."""
        return self._contributions(float_rows(self.hashed_rows(X), self.feature_names,
                                              self._category_sets), method, n_threads)

    def _contributions(self, rows: np.ndarray, method: str,
                       n_threads: int | None) -> np.ndarray:
        """``contributions`` of rows ``float_rows`` made (category codes, not hashed again)."""
        from .. import _explain

        codes = {"treeshap": int(_explain.Method.METHOD_TREESHAP),
                 "path": int(_explain.Method.METHOD_PATH)}
        if method not in codes:
            raise ValueError(f"unknown attribution method {method!r} (treeshap or path)")
        if self.aggregate != "sum":  # attributions split a sum of leaves among features
            raise ValueError(f"attributions are not defined for aggregate {self.aggregate} "
                             "(the score is one tree's leaf, not a sum of the trees')")
        if self._explainer is None:
            if "x_tree" not in self.arrays:
                raise ValueError("this artifact has no node covers, which attributions need: "
                                 "compile the model again with this version (a model whose "
                                 "trees have a split with zero cover has none)")
            self._explainer = _explain.Explainer(self.arrays, self.n_features, self.n_outputs,
                                                 float(self.divisor))
        out = self._explainer.contributions(rows, codes[method], n_threads or default_threads())
        return out[:, 0, :] if self.n_outputs == 1 else out

    def reasons(self, X, r: ScoreResult, method: str = "treeshap", top_k: int = 3,
                min_score: float | None = None, n_threads: int | None = None) -> ScoreResult:
        """``r`` with reason codes for its rows whose score is at or above ``min_score``
        (all rows when None): the top-k features by absolute attribution to the output the
        row's label comes from (its margin for binary and regression models), their
        attributions and the bias. The attributions cover every tree, also for a row a lazy
        policy stopped early."""
        from .. import _explain

        n = len(r)
        k = min(top_k, self.n_features)
        feat = np.full((n, k), -1, dtype=np.int32)
        val = np.zeros((n, k), dtype=np.float32)
        bias = np.full(n, np.nan, dtype=np.float64)
        rows = np.arange(n) if min_score is None else np.flatnonzero(r.score >= min_score)
        if rows.size:
            read = float_rows(self.hashed_rows(X), self.feature_names, self._category_sets)
            phi = self._contributions(read[rows] if rows.size < n else read, method,
                                      n_threads)
            if phi.ndim == 3:  # several outputs: the one of each row's label
                phi = phi[np.arange(rows.size), np.maximum(r.label[rows], 0)]
            _explain.top_reasons(phi, rows.astype(np.int64, copy=False), feat, val)
            bias[rows] = phi[:, -1]
        r.reason_feature, r.reason_value, r.reason_bias = feat, val, bias
        return r

    def _audit(self, X, cols, result: ScoreResult, thresholds, fraction: float, seed: int,
               n_threads: int | None) -> None:
        """Fully evaluate a deterministic fraction of the rows a policy scored (``audit_mask``
        of their positions in the stream); count decision or label changes."""
        idx = np.flatnonzero(audit_mask(len(result), fraction, seed))
        d = 0
        if idx.size:
            if isinstance(X, _kernels.Columns):  # no rows to take: score all, keep those
                full = self._score_batch(cols, "off", thresholds, n_threads).take(idx)
            elif hasattr(X, "schema") and hasattr(X, "take"):
                import pyarrow as pa

                full = self._score_batch(X.take(pa.array(idx, type=pa.int64())), "off",
                                         thresholds, n_threads)
            else:
                rows = X if type(X) is _HashedRows else np.asarray(X)  # (not hashed again)
                full = self._score_batch(rows[idx], "off", thresholds, n_threads)
            bad = (full.decision != result.decision[idx]) | (full.label != result.label[idx])
            d = int(bad.sum())
        result.audit_rows = int(idx.size)
        result.audit_disagreements = d

    def score_batch(self, X, lazy: str = "off", thresholds=(0.5,), n_threads: int | None = None,
                    explain: str | None = None, top_k: int = 3,
                    explain_min_score: float | None = None, monitor=None,
                    **params) -> ScoreResult:
        """Scores, labels, decisions, work units and stop reasons (docs/models.md: Python API).
        ``explain`` (``treeshap`` or ``path``): reason codes (``reasons``) for the rows
        scored at or above ``explain_min_score`` (default: the lowest threshold).
        ``monitor`` (``monitor_counts()``): the rows and scores counted against the
        reference profile, in the same call."""
        if monitor is not None and type(monitor) is not _Counts and \
                not isinstance(monitor, _Counts):
            raise TypeError("monitor: the counts model.monitor_counts() makes, not a "
                            f"{type(monitor).__name__}")
        problem = self.threshold_problem(thresholds)
        if problem is not None:
            raise ValueError(f"thresholds: {problem}")
        X = self.by_name(X)
        if monitor is not None:  # read once: the rows counted are the rows scored
            if self.category_hashes:  # (CatBoost's categories hashed once, not again)
                H = self.hashed_rows(X)
                if type(H) is np.ndarray and H.dtype == np.float32 and H.ndim == 2 and \
                        H.shape[1] == self.n_features:
                    X = H.view(_HashedRows)
            elif type(X) is not np.ndarray and not isinstance(X, _kernels.Columns) and \
                    not hasattr(X, "schema"):
                X = np.asarray(X)
        r = self._score_batch(X, lazy, thresholds, n_threads, **params)
        if explain is not None:
            low = min(thresholds) if explain_min_score is None else explain_min_score
            self.reasons(X, r, explain, top_k, low, n_threads)
        if monitor is not None:  # (refused if another model's: the owner is checked)
            # numpy rows as the counter reads them (a float32 row block where it lies, any
            # other staged), anything else as the kernels staged it; counted once the call
            # has succeeded
            monitor.add(X if type(X) is np.ndarray and not self.category_hashes else
                        X.view(np.ndarray) if type(X) is _HashedRows else self.columns(X),
                        r.score, self)
        return r

    def _score_batch(self, X, lazy: str, thresholds, n_threads: int | None,
                     **params) -> ScoreResult:
        if lazy != "off":
            cols = self.columns(X)
            r = score_lazy(self.lazy_target, cols, lazy, thresholds, n_threads, **params)
            fraction = float(params.get("audit_fraction", 0.0))
            if fraction > 0:
                self._audit(X, cols, r, thresholds, fraction, int(params.get("audit_seed", 0)),
                            n_threads)
            return r
        raw = self.raw(X, n_threads)
        score, label = self.score_from_raw(raw)
        n = score.shape[0]
        return ScoreResult(
            score=score,
            label=label,
            decision=decisions(score, thresholds),
            work_units=np.full(n, self.work_total, dtype=np.int32),
            stop_code=np.zeros(n, dtype=np.int8),
            score_lo=score.copy(),
            score_hi=score.copy(),
        )


_Counts = reference.Counts  # (score_batch's monitor: one lookup a call, not two)


def numbers_only(X: np.ndarray) -> None:
    """TypeError unless ``X`` holds numbers (numeric or boolean dtype; an object array of
    numbers, None and NaN for missing values): strings were parsed as numbers and complex
    numbers cut to their real part (a hostile review), where positional rows of another
    kind are a mistake upstream."""
    if X.dtype.kind in "biuf":
        return
    if X.dtype.kind != "O":
        raise TypeError(f"rows of dtype {X.dtype}: numbers only (a numeric or boolean array; "
                        "strings are not parsed, complex numbers not cut to their real part)")
    for v in X.flat:
        if v is not None and (not isinstance(v, (int, float, np.integer, np.floating))
                              or isinstance(v, complex)):
            raise TypeError(f"rows hold a {type(v).__name__} value: numbers only (None or NaN "
                            "for a missing value; a category by name: a DataFrame or an "
                            "Arrow table)")


class _HashedRows(np.ndarray):
    """Rows ``hashed_rows`` made (float32, categorical values as their codes), marked so they
    are read as they are, not hashed again (score_batch with a monitor scores and counts the
    same rows; hashed_rows gives them back as a plain array)."""


def named_table(X, feature_names: list[str], categorical: set[str], hashed=frozenset()):
    """``X`` matched to the features by name where it is a pandas DataFrame or a dict of
    columns (anything else is returned as it is: numpy is positional). A pyarrow Table,
    category columns as dictionary-encoded strings of their category names (pandas'
    categories of numbers or booleans as Python writes them, the way the loaders keep a
    model's names); for a model with hashed categories (CatBoost's) the frame's own columns
    in the model's order (strings and numbers are hashed as CatBoost hashes them). Refused
    (KeyError, TypeError) naming the column: a frame without a feature, a feature named
    twice, a number for a feature the model knows by category names (a code means another
    category once the model is retrained)."""
    module = type(X).__module__.split(".")[0]
    if module == "pandas" and not hasattr(X, "columns"):
        raise TypeError(f"a {type(X).__name__} is not rows: pass a DataFrame (or numpy rows)")
    is_frame = module == "pandas" and hasattr(X, "dtypes")
    if not is_frame and not isinstance(X, dict):
        return X
    if not is_frame:  # (the features' only: other keys are ignored)
        wanted = set(feature_names)
        one = [str(k) for k, v in X.items() if str(k) in wanted and (
            v is None or isinstance(v, (str, bytes)) or np.isscalar(v) or
            getattr(v, "ndim", 1) == 0)]
        if one:
            raise TypeError(f"a dict of columns: {one[0]!r} is one value, not a column (one "
                            "row: wrap each value in a list, {name: [value]})")
    import pyarrow as pa

    names = [str(c) for c in (X.columns if is_frame else X)]
    wanted = set(feature_names)
    dup = sorted({n for n in names if names.count(n) > 1} & wanted)
    if dup:
        raise ValueError(f"the frame names column(s) {', '.join(dup[:5])} more than once")
    missing = [f for f in feature_names if f not in set(names)]
    if missing:
        hint = "" if set(names) & wanted else (
            f" (its columns {', '.join(names[:3])}{'...' if len(names) > 3 else ''} name none "
            "of the model's features: name them, or pass numpy rows in the model's order)")
        raise KeyError(f"missing feature column(s): {', '.join(missing[:5])}"
                       + (f" and {len(missing) - 5} more" if len(missing) > 5 else "") + hint)
    if is_frame and hashed:  # CatBoost's: its values as numpy reads them, in the model's order
        return X[[c for f in feature_names for c in X.columns if str(c) == f]]
    if is_frame:
        by_name = {str(c): c for c in X.columns}
        table = pa.Table.from_pandas(X[[by_name[f] for f in feature_names]],
                                     preserve_index=False).rename_columns(feature_names)
    else:
        table = pa.table({f: X[next(k for k in X if str(k) == f)] for f in feature_names})
    for name in categorical:
        i = table.schema.get_field_index(name)
        col = table.column(i).combine_chunks()
        t = col.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            col = col.dictionary_encode()
        elif pa.types.is_dictionary(t) and not (pa.types.is_string(t.value_type) or
                                                pa.types.is_large_string(t.value_type)):
            words = pa.array([None if v is None else str(v)
                              for v in col.dictionary.to_pylist()], pa.string())
            col = pa.DictionaryArray.from_arrays(col.indices, words)
        table = table.set_column(i, name, col)
    refuse_codes(table, categorical)
    return table


def refuse_codes(table, categorical) -> None:
    """TypeError naming a column of numbers for a feature the model knows by its category
    names (``categorical``): a code means another category once the model is retrained
    (the Python API's frames and dicts, the ``score`` command's files; a pyarrow table given
    to the Python API is read as the stream's decoded batches are: codes)."""
    import pyarrow as pa

    for name in categorical:
        if name not in table.column_names:
            continue
        t = table.schema.field(name).type
        if not (pa.types.is_dictionary(t) or _is_plain_string(t) or pa.types.is_null(t)):
            raise TypeError(f"feature {name!r} is {t}; the model knows it by its category "
                            "names: pass them (strings, dictionary-encoded strings or a "
                            "pandas category column), not codes")


def feature_type_problem(name: str, t, categorical: bool = False) -> str | None:
    """Why an Arrow type cannot be a feature column (None: it can): numeric, boolean or null
    (all missing) types; for a feature with categories also dictionary-encoded strings."""
    import pyarrow as pa

    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) \
            or pa.types.is_null(t) or categorical and is_category_type(t):
        return None
    if categorical:
        return (f"feature column {name!r} has type {t}, expected a numeric type or "
                "dictionary-encoded strings")
    return f"feature column {name!r} has type {t}, expected a numeric or boolean type"


def is_category_type(t) -> bool:
    import pyarrow as pa

    return pa.types.is_dictionary(t) and pa.types.is_integer(t.index_type) and (
        pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type))


def category_sets(categories: dict[str, list[str]], hashes: dict | None = None) -> dict:
    """The model's category lists as Arrow string arrays, and its hashed categories
    (CatBoost's, ``cathash.CatBoostHashes``), built once (at load, or when a decoder starts),
    for ``category_codes``."""
    import pyarrow as pa

    from .cathash import CatBoostHashes

    out = {name: pa.array(cats, type=pa.string()) for name, cats in categories.items()}
    out.update({name: CatBoostHashes(h) for name, h in (hashes or {}).items()})
    return out


def maps_column(t, value_set) -> bool:
    """Whether a column of Arrow type ``t`` is read through ``value_set`` (``category_sets``):
    dictionary-encoded strings; for hashed categories numbers too (their codes come from
    their hashes, never from their values)."""
    import pyarrow as pa

    from .cathash import CatBoostHashes

    return is_category_type(t) or isinstance(value_set, CatBoostHashes) and (
        pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def category_codes(col, value_set):
    """A dictionary-encoded string column as float32 category codes: each dictionary string's
    position in ``value_set`` (``category_sets``), looked up once per dictionary (not per
    row); missing where the value is, NaN where the string is not a category (the libraries'
    unseen category). Hashed categories: each dictionary string's hash, or each number's
    (``maps_column``), looked up among the model's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .cathash import CatBoostHashes

    if isinstance(col, pa.ChunkedArray):
        if not pa.types.is_dictionary(col.type):
            col = col.combine_chunks()
        else:
            col = col.unify_dictionaries().combine_chunks() if col.num_chunks != 1 \
                else col.chunk(0)
    if isinstance(value_set, CatBoostHashes):
        if not pa.types.is_dictionary(col.type):  # numbers
            if pa.types.is_floating(col.type) and col.type.bit_width == 16:
                col = col.cast(pa.float32())
            v = col.fill_null(False if pa.types.is_boolean(col.type) else 0).to_numpy(
                zero_copy_only=False)
            codes = value_set.codes_of_numbers(v)
            if col.null_count:
                codes[np.asarray(col.is_null())] = np.nan
            return pa.array(codes, type=pa.float32())
        strings = col.dictionary.cast(pa.string()).to_pylist()
        return pa.array(value_set.codes_of_strings(strings), type=pa.float32()).take(
            col.indices).fill_null(float("nan"))
    where = pc.index_in(col.dictionary.cast(pa.string()), value_set=value_set)
    codes = where.cast(pa.float32()).fill_null(float("nan"))
    return codes.take(col.indices)


def unseen_categories(col, value_set) -> int:
    """How many values of a dictionary-encoded string column are strings that are not in
    ``value_set`` (``category_sets``): a null (an index or a dictionary value) is missing,
    not unseen."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        return sum(unseen_categories(c, value_set) for c in col.chunks)
    words = col.dictionary.cast(pa.string())
    not_known = pc.and_(pc.is_null(pc.index_in(words, value_set=value_set)),
                        pc.is_valid(words))
    return int(pc.sum(pc.fill_null(not_known.take(col.indices), False)).as_py() or 0)


def float_rows(X, feature_names: list[str], categories: dict | None = None) -> np.ndarray:
    """Rows as C-contiguous float32, missing as NaN, from numpy or a pyarrow Table/RecordBatch
    (the conversions the kernels' stager makes: a C cast of each value to float; strings of a
    feature with categories (``category_sets``): their codes)."""
    if hasattr(X, "schema") and hasattr(X, "column"):
        import pyarrow as pa

        cats = categories or {}
        cols = []
        _require_columns(X, feature_names)
        for name in feature_names:
            col = X.column(name)
            if name in cats and _is_plain_string(col.type):
                col = col.dictionary_encode()
            if name in cats and maps_column(col.type, cats[name]):
                col = category_codes(col, cats[name])
            col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            problem = feature_type_problem(name, col.type)
            if problem:
                raise TypeError(problem)
            if pa.types.is_null(col.type):
                cols.append(np.full(len(col), np.nan, dtype=np.float32))
                continue
            missing = np.asarray(col.is_null())
            if pa.types.is_boolean(col.type):
                col = col.cast(pa.int8())
            v = np.asarray(col.fill_null(0) if col.null_count else col).astype(np.float32)
            v[missing] = np.nan
            cols.append(v)
        return np.ascontiguousarray(np.column_stack(cols) if cols else
                                    np.empty((X.num_rows, 0), np.float32))
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows, features); got shape {X.shape}")
    numbers_only(X)
    return np.ascontiguousarray(X, dtype=np.float32)


def _is_plain_string(t) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _require_columns(data, feature_names: list[str]) -> None:
    """KeyError naming the features a table (or frame read as one) has no column for."""
    schema_names = set(data.schema.names)
    missing = [f for f in feature_names if f not in schema_names]
    if missing:
        raise KeyError(f"missing feature column(s): {', '.join(missing[:5])}"
                       + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def arrow_columns(data, feature_names: list[str], categories: dict | None = None):
    """Feature columns by name from a pyarrow Table/RecordBatch (one chunk each); a feature
    with categories (``category_sets``) may be dictionary-encoded strings
    (``category_codes``)."""
    import pyarrow as pa

    cats = categories or {}
    arrays = []
    _require_columns(data, feature_names)
    for name in feature_names:
        col = data.column(name)
        # buffer sizes against lengths before pyarrow itself reads them (combine, cast), for
        # tables that did not come through codec.decode (the Python API)
        col.validate()
        if name in cats and _is_plain_string(col.type):  # a Parquet file's strings, say
            col = col.dictionary_encode()
        if name in cats and maps_column(col.type, cats[name]):
            col = category_codes(col, cats[name])
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        problem = feature_type_problem(name, col.type)
        if problem:
            raise TypeError(problem)
        if pa.types.is_float16(col.type):
            col = col.cast(pa.float32())
        arrays.append(col)
    return _kernels.Columns.from_arrow(arrays, data.num_rows)


def load_model(path, kernel: str = "auto") -> CompiledModel:
    """A compiled model from its artifact: checksum, then structure, then the kernels' view.
    Every failure is an ArtifactError that names what is wrong. ``kernel``: "auto" (the
    kernel the compile chose, stored in the artifact; measured at load for an artifact
    without that record), or one of walk, quickscorer, oblivious, lanes, masks (an
    ArtifactError saying why where the model cannot take it: the artifact itself is valid)."""
    meta, arrays, model_id = artifact.load(path)
    try:
        return CompiledModel(meta, arrays, model_id, kernel)  # checks the structure first
    except artifact.ArtifactError as exc:
        raise artifact.ArtifactError(f"{path}: {exc}") from None
    except (KeyError, ValueError, TypeError, OverflowError) as exc:
        if kernel != "auto" and str(exc).startswith(f"kernel {kernel}: "):
            raise artifact.ArtifactError(f"{path}: the model is valid, but {exc} (load it "
                                         "with kernel=\"auto\" or \"walk\")") from exc
        raise artifact.ArtifactError(f"{path}: invalid compiled model: {exc}") from exc
