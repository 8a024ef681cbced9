"""The reference profile a model artifact carries for flight monitoring (issue 51): what the
model saw in training, binned as the worker will bin the rows it scores.

For each feature: bin edges (the reference's quantiles, float32, ascending, distinct; a
value's bin is how many edges are <= it), the fraction of the reference rows in each bin and
missing (NaN, null, a category the model does not know), and the range (min, max) of the
values present. A feature with categories has one bin a category code (the last bin takes
the codes past MAX_CATEGORY_BINS - 1). For the score (the model's own on the reference rows):
its bin edges and fractions, and the share of rows in each decision band at the thresholds.
All of it is computed on the rows as the kernels stage them (``worker._monitor``), and stored
as data in the artifact's meta (``meta.reference``), outside the model id: adding a profile
does not change what the model computes.

PSI (population stability index) of a window against the reference: the sum over bins
(missing a bin of its own) of (a - e) * ln(a / e), a and e the window's and the reference's
fractions, each at least EPSILON (an empty bin counts as EPSILON on either side).
"""

from __future__ import annotations

import contextlib
import math
import weakref

import numpy as np

from worker import _monitor

from .artifact import ArtifactError

REFERENCE = "reference"  # the meta key (outside the model id: artifact.OUTSIDE_ID)
DEFAULT_BINS = 10
MAX_BINS = 100
MAX_CATEGORY_BINS = 64
EPSILON = 1e-4  # the fraction an empty bin counts as in PSI (either side)
MIN_ROWS = 100  # a reference of fewer rows says too little to compare against
EXTRA = 3  # monitor counts after a feature's bins: missing, below min, above max


class Profile:
    """A reference profile as arrays the monitor reads (``from_meta`` checks them)."""

    def __init__(self, doc: dict):
        f = doc["features"]
        self.doc = doc
        self.rows = int(doc["rows"])
        self.n_edges = np.asarray([len(x["edges"]) for x in f], np.int32)
        width = max(int(self.n_edges.max(initial=0)), 1)
        self.edges = np.full((len(f), width), np.nan, np.float32)
        for j, x in enumerate(f):
            self.edges[j, :len(x["edges"])] = np.asarray(x["edges"], np.float32)
        self.width = width + 1 + EXTRA  # a feature's row of counts
        # fractions: bins then missing, one row a feature (bins past a feature's own: 0)
        self.fractions = np.zeros((len(f), width + 2), np.float64)
        for j, x in enumerate(f):
            m = len(x["edges"])
            self.fractions[j, :m + 1] = x["fractions"]
            self.fractions[j, m + 1] = x["missing"]
        self.lo = np.asarray([x["min"] if x["min"] is not None else np.inf for x in f],
                             np.float32)
        # a feature the reference never had a value of: every value present is out of its
        # range, counted once (below; NaN: never above)
        self.hi = np.asarray([x["max"] if x["max"] is not None else np.nan for x in f],
                             np.float32)
        s = doc["score"]
        self.score_edges = np.asarray(s["edges"], np.float64)
        self.score_fractions = np.asarray(s["fractions"], np.float64)
        self.thresholds = [float(t) for t in s["thresholds"]]
        self.band_rates = np.asarray(s["band_rates"], np.float64)
        self._plan = None

    @property
    def plan(self):
        """The native counter's layout of this profile (worker._monitor.Plan), built once."""
        if self._plan is None:
            self._plan = _monitor.Plan(self.edges, self.n_edges, self.lo, self.hi,
                                       self.score_edges, self.width)
        return self._plan

    def new_counts(self) -> np.ndarray:
        return np.zeros((len(self.n_edges), self.width), np.int64)

    @classmethod
    def from_meta(cls, meta: dict, feature_names: list[str]) -> Profile | None:
        doc = meta.get(REFERENCE)
        if doc is None:
            return None
        check(doc, feature_names)
        return cls(doc)


def psi(actual: np.ndarray, expected: np.ndarray) -> float:
    """PSI of count (or fraction) vector ``actual`` against fractions ``expected``, both over
    the same bins; NaN when ``actual`` counts nothing."""
    total = float(actual.sum())
    if total <= 0:
        return math.nan
    a = np.maximum(actual / total, EPSILON)
    e = np.maximum(expected, EPSILON)
    return float(np.sum((a - e) * np.log(a / e)))


def feature_psi(counts: np.ndarray, profile: Profile) -> np.ndarray:
    """Each feature's PSI, from one window's ``counts`` (``worker._monitor.count_bins``)."""
    out = np.empty(len(profile.n_edges), np.float64)
    for j, m in enumerate(profile.n_edges.tolist()):
        actual = np.append(counts[j, :m + 1], counts[j, m + 1])
        expected = np.append(profile.fractions[j, :m + 1], profile.fractions[j, m + 1])
        out[j] = psi(actual, expected)
    return out


def score_bins(score: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of ``score`` in the bins of ``edges`` (how many edges are <= a score); a NaN
    score (none is published) in the last."""
    return np.bincount(np.searchsorted(edges, score, side="right"), minlength=len(edges) + 1)


def judge(counts: np.ndarray, score_counts: np.ndarray, profile, names: list[str]) -> dict:
    """The figures of rows counted against ``profile`` (``counts``, ``score_counts``): the
    rows counted, each feature's bin counts, PSI, missing rate and out-of-range rate, and
    the score's bins and PSI (NaN figures where nothing was counted)."""
    p = profile
    idx = np.arange(len(names))
    counted = int(counts[0, :int(p.n_edges[0]) + 2].sum()) if len(names) else 0
    fpsi = feature_psi(counts, p)
    with np.errstate(invalid="ignore", divide="ignore"):
        missing = counts[idx, p.n_edges + 1] / counted
        out_range = (counts[idx, p.n_edges + 2] + counts[idx, p.n_edges + 3]) / counted
    return {
        "counted": counted,
        "counts": {name: {"bins": counts[j, :p.n_edges[j] + 1].tolist(),
                          "missing": int(counts[j, p.n_edges[j] + 1]),
                          "below": int(counts[j, p.n_edges[j] + 2]),
                          "above": int(counts[j, p.n_edges[j] + 3])}
                   for j, name in enumerate(names)},
        "score_bins": score_counts.tolist(),
        "feature_psi": dict(zip(names, fpsi.tolist(), strict=True)),
        "missing_rate": dict(zip(names, missing.tolist(), strict=True)),
        "out_of_range_rate": dict(zip(names, out_range.tolist(), strict=True)),
        "score_psi": psi(score_counts, p.score_fractions),
    }


class Counts(_monitor.Counter):
    """Flight monitoring for the Python API: ``model.score_batch(X, monitor=c)`` counts the
    rows and their scores against the model's reference profile in the same call (native,
    no Python per row); ``figures()`` judges what was counted (``judge``: PSI, missing and
    out-of-range rates a feature, the score's PSI), ``reset()`` starts again. Made by
    ``model.monitor_counts()``; counts with one thread at a time (worker/monitoring.py
    judges the worker's windows with the same ``judge``)."""

    def __init__(self, plan, model):
        if model.reference is None or plan is not model.reference.plan:
            raise ValueError("counts against the model's own reference profile: make them "
                             "with model.monitor_counts()")
        self.model = model  # (the counter's owner: score_batch refuses another model's)
        self.profile = model.reference
        self._same = weakref.WeakSet()  # other loads of the same model and profile

    def _check_owner(self, owner) -> None:
        """``owner`` (a model scoring into these counts) is this model, loaded again (the
        same model id and the same reference profile: compared once a loaded model), or is
        refused naming why."""
        try:
            if owner in self._same:
                return
        except TypeError:  # (not weakly referable: compared each time)
            pass
        reference = getattr(owner, "reference", None)
        if reference is None:
            raise ValueError("monitor: this model has no reference profile (the counts are "
                             "another model's)")
        if getattr(owner, "model_id", None) != self.model.model_id or \
                getattr(reference, "doc", None) != self.profile.doc:
            raise ValueError("monitor: counts made by another model's monitor_counts() (its "
                             "model id or reference profile is not this model's)")
        with contextlib.suppress(TypeError):
            self._same.add(owner)

    def merge(self, other, reset: bool = False) -> None:
        """Another thread's counts of the same model added to these; ``reset``: theirs
        zeroed in the same step (a roll-up that loses no row)."""
        if not isinstance(other, Counts) or other.model.model_id != self.model.model_id or \
                other.profile.doc != self.profile.doc:
            raise ValueError("merge: counts of the same model and reference profile only")
        super().merge(other, reset)

    @property
    def rows(self) -> int:
        c = self.counts
        return int(c[0, :int(self.profile.n_edges[0]) + 2].sum()) if c.shape[0] else 0

    def figures(self) -> dict:
        return judge(self.counts, self.score_counts, self.profile, self.model.feature_names)


def build(model, X, bins: int = DEFAULT_BINS, thresholds=(0.5,)) -> dict:
    """The profile of reference rows ``X`` (a pyarrow Table, a pandas frame, a dict of
    columns, numpy in the model's feature order) for ``model``."""
    if not 2 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be from 2 to {MAX_BINS}, not {bins}")
    thresholds = sorted(float(t) for t in thresholds)
    try:
        cols = model.columns(X)
    except (KeyError, TypeError, ValueError) as exc:  # (said of the reference, not a request)
        if type(exc) not in (KeyError, TypeError, ValueError):
            raise
        raise type(exc)(f"the reference: {exc.args[0] if exc.args else exc}") from exc
    n = int(cols.n_rows)
    if n < MIN_ROWS:
        raise ValueError(f"the reference has {n} rows: at least {MIN_ROWS} are needed")
    rows = _staged(cols)
    features = []
    for j, name in enumerate(model.feature_names):
        v = rows[:, j]
        present = v[~np.isnan(v)]
        finite = present[np.isfinite(present)]
        cats = model.categories.get(name) or model.category_hashes.get(name)
        if cats is not None:
            k = min(len(cats), MAX_CATEGORY_BINS)
            edges = (np.arange(1, k, dtype=np.float32) - np.float32(0.5))
        elif finite.size:
            q = np.quantile(finite.astype(np.float64), np.arange(1, bins) / bins)
            edges = np.unique(q.astype(np.float32))
        else:
            edges = np.zeros(0, np.float32)
        fractions = np.bincount(np.searchsorted(edges, present, side="right"),
                                minlength=len(edges) + 1) / n
        features.append({
            "name": name, "edges": edges.astype(np.float64).tolist(),
            "fractions": fractions.tolist(), "missing": (n - present.size) / n,
            "min": float(present.min()) if present.size else None,
            "max": float(present.max()) if present.size else None,
            "categorical": cats is not None})
    r = model.score_batch(X, thresholds=thresholds)
    score = np.asarray(r.score, np.float64)
    finite = score[np.isfinite(score)]
    q = np.quantile(finite, np.arange(1, bins) / bins) if finite.size else np.zeros(0)
    score_edges = np.unique(q)
    return {
        "rows": n, "bins": bins, "features": features,
        "score": {"edges": score_edges.tolist(),
                  "fractions": (score_bins(score, score_edges) / n).tolist(),
                  "thresholds": thresholds,
                  "band_rates": (np.bincount(np.asarray(r.decision, np.int64),
                                             minlength=len(thresholds) + 1) / n).tolist()}}


def _staged(cols) -> np.ndarray:
    """The rows of column descriptors as the kernels stage them (float32, missing NaN)."""
    return _monitor.stage(cols)


def check(doc, feature_names: list[str]) -> None:
    """A stored profile, proved well formed before the monitor reads it: ArtifactError
    naming the field otherwise."""
    def fail(field: str, what: str):
        raise ArtifactError(f"invalid compiled model: meta.reference.{field}: {what}")

    def fraction_list(x, n: int, field: str) -> None:
        if not isinstance(x, list) or len(x) != n or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
                for v in x):
            fail(field, f"not {n} fractions in [0, 1]")

    def ascending(x, field: str, limit: int) -> None:
        if not isinstance(x, list) or len(x) > limit or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in x) or any(b <= a for a, b in zip(x, x[1:], strict=False)):
            fail(field, f"not at most {limit} finite values, ascending and distinct")

    if not isinstance(doc, dict):
        fail("", "not a mapping")
    rows = doc.get("rows")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        fail("rows", f"{rows!r} is not a positive integer")
    f = doc.get("features")
    if not isinstance(f, list) or len(f) != len(feature_names):
        fail("features", f"not one entry a feature ({len(feature_names)})")
    for j, x in enumerate(f):
        at = f"features[{j}]"
        if not isinstance(x, dict) or x.get("name") != feature_names[j]:
            fail(at, f"not the profile of feature {feature_names[j]!r}")
        ascending(x.get("edges"), f"{at}.edges", max(MAX_BINS, MAX_CATEGORY_BINS) - 1)
        fraction_list(x.get("fractions"), len(x["edges"]) + 1, f"{at}.fractions")
        fraction_list([x.get("missing")], 1, f"{at}.missing")
        for key in ("min", "max"):
            v = x.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or v != v):
                fail(f"{at}.{key}", f"{v!r} is not a number")
    s = doc.get("score")
    if not isinstance(s, dict):
        fail("score", "not a mapping")
    ascending(s.get("edges"), "score.edges", MAX_BINS - 1)
    fraction_list(s.get("fractions"), len(s["edges"]) + 1, "score.fractions")
    t = s.get("thresholds")
    if not isinstance(t, list) or not 1 <= len(t) <= 16 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in t) or t != sorted(t):
        fail("score.thresholds", "not 1 to 16 finite thresholds, ascending")
    fraction_list(s.get("band_rates"), len(t) + 1, "score.band_rates")
