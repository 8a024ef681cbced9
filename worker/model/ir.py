"""The one intermediate form every loader produces (plain dataclasses, numpy arrays).

Split rule, the same for every source: a row goes to the *right* child iff ``x > threshold``
with ``x`` and ``threshold`` both float32, and a missing ``x`` (NaN) goes right iff
``default_left`` is false. Loaders translate their library's rule into this one exactly:

* XGBoost ``x < s`` (float32): right iff ``x >= s`` iff ``x > nextafter(s, -inf)``.
* scikit-learn ``x <= t`` (float32 x, float64 t): right iff ``x > t32`` with ``t32`` the largest
  float32 not above ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class UnsupportedModelError(ValueError):
    """The model uses something the compiler cannot reproduce exactly."""


@dataclass
class Tree:
    """One decision tree. Node 0 is the root; leaves have ``feature == -1``."""

    feature: np.ndarray  # int32 (n_nodes,), -1 at leaves
    threshold: np.ndarray  # float32 (n_nodes,), canonical "go right iff x > threshold"
    left: np.ndarray  # int32 (n_nodes,), -1 at leaves
    right: np.ndarray  # int32 (n_nodes,), -1 at leaves
    default_left: np.ndarray  # bool (n_nodes,), where a missing value goes
    value: np.ndarray  # float64 (n_nodes, n_leaf_outputs), meaningful at leaves only
    # float64 (n_nodes,): the training weight reaching each node (XGBoost's sum of hessians,
    # scikit-learn's weighted sample count); what TreeSHAP needs. None: not known
    cover: np.ndarray | None = None

    @property
    def n_nodes(self) -> int:
        return int(self.feature.shape[0])

    def check(self, n_features: int, where: str) -> None:
        """A tree every walk from the root leaves: children inside the tree, no node with two
        parents (so no cycle through the root's tree), features below ``n_features``. Run
        before anything walks a tree read from a file (a skops file can hold any arrays)."""
        n = self.n_nodes
        arrays = (self.threshold, self.left, self.right, self.default_left, self.value)
        if n == 0 or any(a.shape[0] != n for a in arrays):
            raise UnsupportedModelError(f"{where}: malformed tree (node arrays differ in length)")
        inner = self.feature >= 0
        kids = np.concatenate([self.left[inner], self.right[inner]]).astype(np.int64)
        if np.any(self.feature >= n_features):
            raise UnsupportedModelError(f"{where}: a node reads a feature beyond {n_features}")
        if kids.size and (kids.min() < 1 or kids.max() >= n
                          or np.unique(kids).size != kids.size):
            raise UnsupportedModelError(f"{where}: malformed tree (a child outside the tree or "
                                        "a node with two parents)")

    def depth(self) -> int:
        """Maximum number of splits on a root-to-leaf path."""
        best, stack = 0, [(0, 0)]
        while stack:
            node, d = stack.pop()
            if self.feature[node] < 0:
                best = max(best, d)
            else:
                stack.append((int(self.left[node]), d + 1))
                stack.append((int(self.right[node]), d + 1))
        return best

    def leaf_range(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-output minimum and maximum over this tree's leaves."""
        leaves = self.value[self.feature < 0]
        return leaves.min(axis=0), leaves.max(axis=0)


@dataclass
class Ensemble:
    """A tree ensemble whose raw score is ``(base + t_0 + t_1 + ...) / divisor``, summed in order.

    ``tree_group[i]`` is the output column tree ``i`` adds to, or -1 when its leaves carry one
    value per output (soft-voting forest classifiers). Trees are in evaluation order; work unit
    ``u`` (a forest tree or a boosting round) is trees ``unit_ptr[u]:unit_ptr[u+1]``.
    """

    trees: list[Tree]
    tree_group: np.ndarray  # int32 (n_trees,)
    unit_ptr: np.ndarray  # int64 (n_units + 1,)
    n_outputs: int  # raw score columns
    base: np.ndarray  # float64 (n_outputs,) raw score before any tree
    divisor: float  # the sum is divided by it (n_trees for averaged forests, else 1.0)
    link: str  # identity | sigmoid | sigmoid2 | softmax | vote (averaged class fractions)
    task: str  # binary | multiclass | regression
    n_features: int
    feature_names: list[str]
    classes: list = field(default_factory=list)  # class labels (classifiers)
    accumulate: str = "float64"  # float32 reproduces XGBoost's own float32 sum
    objective: str = ""
    source: str = ""  # e.g. "xgboost 3.2.0"
    kind: str = ""  # estimator class or booster kind
    notes: list[str] = field(default_factory=list)

    @property
    def n_trees(self) -> int:
        return len(self.trees)

    @property
    def work_total(self) -> int:
        return int(self.unit_ptr.shape[0] - 1)

    @property
    def n_classes(self) -> int:
        return len(self.classes)


def float32_at_or_below(t: np.ndarray) -> np.ndarray:
    """Largest float32 not above each float64 threshold (exact for ``x <= t`` with float32 x)."""
    t = np.asarray(t, dtype=np.float64)
    t32 = t.astype(np.float32)
    up = t32.astype(np.float64) > t
    t32[up] = np.nextafter(t32[up], np.float32(-np.inf))
    return t32


def float32_below(s: np.ndarray) -> np.ndarray:
    """For ``x < s`` in float32: the threshold ``t`` with ``x < s`` iff ``not x > t``."""
    s = np.asarray(s, dtype=np.float32)
    return np.nextafter(s, np.float32(-np.inf))
