"""What scoring returns: per-row results, the stop-reason table and decision bands."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from .. import _lazy

# stop reasons in code order (the kernels' StopReason enum; the output's dictionary-encoded
# `stop_reason` column). `audit` is reserved by the message contract for audited rows.
STOP_REASONS = np.array([r.name.removeprefix("STOP_").lower()
                         for r in sorted(_lazy.StopReason, key=int)] + ["audit"], dtype=object)


def default_threads() -> int:
    """Kernel threads when none are asked for: every core this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


@dataclass
class ScoreResult:
    """Per-row results of ``score_batch`` (numpy arrays, input order)."""

    score: np.ndarray  # float64
    label: np.ndarray  # class index (classifiers) or -1
    decision: np.ndarray  # int8 band index
    work_units: np.ndarray  # int32
    stop_code: np.ndarray  # int8 index into STOP_REASONS
    score_lo: np.ndarray  # float64
    score_hi: np.ndarray  # float64
    audit_rows: int = 0  # rows also evaluated in full (the audit), and among them
    audit_disagreements: int = 0  # those whose decision or label differs
    # reason codes (score_batch(explain=...)): per row the top-k features by absolute
    # attribution (int32 (n, k) feature indices, -1 where a row is not explained), their
    # attributions (float32 (n, k)) and the bias (float64 (n,), NaN where not explained)
    reason_feature: np.ndarray | None = None
    reason_value: np.ndarray | None = None
    reason_bias: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.score.shape[0])

    @property
    def stop_reason(self) -> np.ndarray:
        """Stop reasons as strings (object array)."""
        return STOP_REASONS[self.stop_code]

    def take(self, idx: np.ndarray) -> ScoreResult:
        reasons = [None if a is None else a[idx] for a in
                   (self.reason_feature, self.reason_value, self.reason_bias)]
        return ScoreResult(self.score[idx], self.label[idx], self.decision[idx],
                           self.work_units[idx], self.stop_code[idx], self.score_lo[idx],
                           self.score_hi[idx], 0, 0, *reasons)


MAX_THRESHOLDS = 127  # a decision is a band index of 8 bits (int8): 0 to 127


def decisions(score: np.ndarray, thresholds) -> np.ndarray:
    """Band index: how many thresholds the score is >= to."""
    return np.searchsorted(_sorted(tuple(thresholds)), score, side="right").astype(np.int8)


@functools.lru_cache(maxsize=64)
def _sorted(thresholds: tuple) -> np.ndarray:
    """The thresholds sorted, once per set (a one-row request would sort them every time)."""
    t = np.sort(np.asarray(thresholds, dtype=np.float64))
    t.setflags(write=False)
    return t
