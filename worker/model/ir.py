"""The one intermediate form every loader produces (plain dataclasses, numpy arrays).

Split rule, the same for every source: a row goes to the *right* child iff ``x > threshold``
with ``x`` and ``threshold`` both float32, and a missing ``x`` (NaN) goes right iff
``default_left`` is false. Loaders translate their library's rule into this one exactly:

* XGBoost ``x < s`` (float32): right iff ``x >= s`` iff ``x > nextafter(s, -inf)``.
* scikit-learn and LightGBM ``x <= t`` (float32 x, float64 t): right iff ``x > t32`` with ``t32``
  the largest float32 not above ``t``.

Nodes that this rule cannot express carry a *special* entry (``Tree.special``): categorical
splits (a category goes to the side its bit says) and LightGBM's zero-as-missing numerical
splits (zeros go where missing values go). The entry is the words the kernels read
(``walk.h``, ``sw_special_right``); build it with ``categorical_entry`` or ``zero_band_entry``.
A missing value at a special node still goes right iff ``default_left`` is false.
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
    # node -> its special entry (uint32 words, see categorical_entry / zero_band_entry)
    special: dict[int, np.ndarray] = field(default_factory=dict)

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
        for node, entry in self.special.items():
            if not 0 <= node < n or self.feature[node] < 0:
                raise UnsupportedModelError(f"{where}: a categorical split on a leaf")
            check_entry(np.asarray(entry, dtype=np.uint32), where)

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

    @classmethod
    def constant(cls, value) -> Tree:
        """A tree of one leaf: ``value`` (one entry per output it adds to) for every row (a
        base added after the trees, where a library adds it last)."""
        return cls(feature=np.array([-1], np.int32), threshold=np.zeros(1, np.float32),
                   left=np.array([-1], np.int32), right=np.array([-1], np.int32),
                   default_left=np.zeros(1, bool),
                   value=np.asarray(value, dtype=np.float64).reshape(1, -1))

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
    # feature name -> its categories in code order, for string (dictionary) inputs: a string
    # becomes its position in the list; one not in the list is missing
    categories: dict[str, list[str]] = field(default_factory=dict)
    # feature name -> the hashes of its categories in code order (CatBoost: a value's code is
    # its hash's position; model/cathash.py)
    category_hashes: dict[str, list[int]] = field(default_factory=dict)
    accumulate: str = "float64"  # float32 reproduces XGBoost's own float32 sum
    # "sum" (the trees added, as above), or "min" / "max": ONNX Runtime's aggregate_function
    # MIN / MAX, the raw score is base + the smallest (largest) of the trees' leaves
    aggregate: str = "sum"
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
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf, stepped back below
        t32 = t.astype(np.float32)
    up = t32.astype(np.float64) > t
    t32[up] = np.nextafter(t32[up], np.float32(-np.inf))
    return t32


def float32_below(s: np.ndarray) -> np.ndarray:
    """For ``x < s`` in float32: the threshold ``t`` with ``x < s`` iff ``not x > t``."""
    s = np.asarray(s, dtype=np.float32)
    return np.nextafter(s, np.float32(-np.inf))


# Special node entries, as the kernels read them (walk.h, sw_special_right). Word 0 is a
# header: SP_ZERO for a zero-as-missing split; else the number n of category bits, with SP_INT
# when only whole numbers are categories and SP_TRUNC when values in (-1, 0) are category 0
# (LightGBM casts to int first). A categorical entry continues with n + 3 bits: bit 0 says
# where a negative value goes, bit c + 1 whether category c goes right, bit n + 1 where a
# value at or above n goes, bit n + 2 where a missing value goes (as ``default_left`` says).
# A zero-band entry continues with the float32 threshold and the band's half-width:
# |v| <= band goes where missing values go, other values right iff v > threshold.
SP_INT = 0x80000000
SP_ZERO = 0x40000000
SP_TRUNC = 0x20000000
MAX_CATEGORY_BITS = 1 << 20


def categorical_entry(right: np.ndarray, beyond_right: bool, negative_right: bool,
                      truncate: bool, whole_only: bool = False,
                      missing_right: bool = True) -> np.ndarray:
    """``right[c]``: category c goes right. ``truncate``: a value in (-1, 0) is category 0;
    otherwise any value below 0 is negative. ``whole_only``: a fractional value is not a
    category (it goes where ``beyond_right`` says). ``missing_right``: the node's
    ``not default_left`` (the loaders set both)."""
    right = np.asarray(right, dtype=bool)
    n = int(right.shape[0])
    if n > MAX_CATEGORY_BITS:
        raise UnsupportedModelError(f"a categorical split over {n} categories (at most "
                                    f"{MAX_CATEGORY_BITS})")
    bits = np.zeros(n + 3, dtype=bool)
    bits[1:n + 1] = right
    bits[0], bits[n + 1], bits[n + 2] = negative_right, beyond_right, missing_right
    words = np.packbits(np.concatenate([bits, np.zeros((-bits.size) % 32, bool)]),
                        bitorder="little").view("<u4")
    head = n | (SP_INT if whole_only else 0) | (SP_TRUNC if truncate else 0)
    return np.concatenate([np.asarray([head], dtype=np.uint32), words.astype(np.uint32)])


def zero_band_entry(threshold, band) -> np.ndarray:
    """LightGBM's ``missing_type=Zero``: |v| <= band goes where missing values go; other
    values go right iff v > threshold (float32)."""
    return np.asarray([SP_ZERO, np.float32(threshold).view(np.uint32),
                       np.float32(band).view(np.uint32)], dtype=np.uint32)


def entry_size(words: np.ndarray, at: int = 0) -> int:
    """Words the entry at ``at`` spans (0: not a valid header)."""
    head = int(words[at])
    if head == SP_ZERO:
        return 3
    if head & SP_ZERO:
        return 0
    n = head & ~(SP_INT | SP_TRUNC)
    if n > MAX_CATEGORY_BITS:
        return 0
    return 1 + (n + 3 + 31) // 32


def entry_bits(words: np.ndarray) -> tuple[int, np.ndarray]:
    """(header, the n + 3 bits) of a categorical entry."""
    head = int(words[0])
    n = head & ~(SP_INT | SP_TRUNC)
    bits = np.unpackbits(np.asarray(words[1:], dtype="<u4").view(np.uint8), bitorder="little")
    return head, bits[:n + 3].astype(bool)


def widen_entry(words: np.ndarray, n: int) -> np.ndarray:
    """The same split over n categories (n at least its own): categories it did not list go
    where a value past its list went."""
    head, bits = entry_bits(words)
    own = head & ~(SP_INT | SP_TRUNC)
    right = np.concatenate([bits[1:own + 1], np.full(n - own, bits[own + 1])])
    return categorical_entry(right, bool(bits[own + 1]), bool(bits[0]),
                             bool(head & SP_TRUNC), bool(head & SP_INT), bool(bits[own + 2]))


def check_entry(words: np.ndarray, where: str) -> None:
    if words.ndim != 1 or words.size == 0 or entry_size(words) != words.size:
        raise UnsupportedModelError(f"{where}: a malformed categorical split")
