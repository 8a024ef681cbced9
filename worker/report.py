"""Run summaries: what a scored output file holds, as numbers, a rich table and a PNG.

Reads the file sink's output, a recorded topic (``worker.io.records``) whose message values are
Arrow IPC streams with the output columns (``id, score, label, decision, work_units,
stop_reason, score_lo, score_hi``), after the fact (``summarize``), and the end-of-run summary
the worker prints from its own counts (``summary_of_run``: no re-read of the output).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import numpy.random  # noqa: F401 (loaded with the worker, not inside its first batch)
import pyarrow as pa

from .io.records import read_outputs


@dataclass
class Summary:
    """Counts and rates of one run. ``rich`` renders it as ``table()``:
    ``Console().print(summarize(...))``."""

    records: int
    messages: int
    elapsed_s: float | None
    work_total: int | None
    mean_work_units: float
    stop_reasons: dict[str, int]
    thresholds: list[float]
    decisions: dict[str, int]  # band label -> rows, every band listed, lowest first
    dead_letters: int | None = None
    undecodable: int = 0  # output messages that were not Arrow streams with the output columns
    png_path: Path | None = None
    score_quantiles: dict[str, float] = field(default_factory=dict)

    @property
    def records_per_s(self) -> float | None:
        if not self.elapsed_s or self.elapsed_s <= 0:
            return None
        return self.records / self.elapsed_s

    @property
    def work_fraction(self) -> float | None:
        """Mean work units as a share of the full model (1.0 = every tree, every row)."""
        if not self.work_total or not self.records:
            return None
        return self.mean_work_units / self.work_total

    def as_dict(self) -> dict:
        return {
            "records": self.records, "messages": self.messages, "elapsed_s": self.elapsed_s,
            "records_per_s": self.records_per_s, "dead_letters": self.dead_letters,
            "undecodable": self.undecodable, "work_total": self.work_total,
            "mean_work_units": self.mean_work_units, "work_fraction": self.work_fraction,
            "stop_reasons": dict(self.stop_reasons), "thresholds": list(self.thresholds),
            "decisions": dict(self.decisions), "score_quantiles": dict(self.score_quantiles),
            "png_path": str(self.png_path) if self.png_path else None,
        }

    def __rich__(self):
        return self.table()

    def table(self, title: str = "scoring summary"):
        """A rich Table; print it with ``rich.console.Console().print(summary.table())``."""
        from rich.table import Table

        t = Table(title=title, show_header=False, title_justify="left")
        t.add_column(style="bold")
        t.add_column(justify="right")
        t.add_row("records", f"{self.records:,}")
        rate = self.records_per_s
        if self.elapsed_s is not None:
            t.add_row("elapsed", f"{self.elapsed_s:.2f} s")
        if rate is not None:
            t.add_row("records/s", f"{rate:,.0f}")
        t.add_row("messages", f"{self.messages:,}")
        if self.dead_letters is not None:
            t.add_row("dead-lettered", f"{self.dead_letters:,}")
        if self.undecodable:
            t.add_row("undecodable output", f"[red]{self.undecodable:,}[/]")
        work = f"{self.mean_work_units:,.2f}"
        if self.work_total and self.work_fraction is not None:
            work += f" of {self.work_total:,} ({self.work_fraction:.1%})"
        t.add_row("mean work units", work)
        total = max(self.records, 1)
        for reason, count in self.stop_reasons.items():
            t.add_row(f"stop: {reason}", f"{count:,} ({count / total:.1%})")
        for band, count in self.decisions.items():
            t.add_row(f"decision {band}", f"{count:,} ({count / total:.2%})")
        if self.png_path:
            t.add_row("histograms", str(self.png_path))
        return t


def band_labels(thresholds) -> list[str]:
    """Decision band labels: [0.5, 0.9] -> ['0: < 0.5', '1: [0.5, 0.9)', '2: >= 0.9']."""
    t = sorted(float(x) for x in thresholds)
    if not t:
        return ["0: all"]
    labels = [f"0: < {t[0]:g}"]
    labels += [f"{i + 1}: [{a:g}, {b:g})" for i, (a, b) in enumerate(pairwise(t))]
    labels.append(f"{len(t)}: >= {t[-1]:g}")
    return labels


def read_output(path: str | Path) -> tuple[pa.Table | None, int, int, int | None]:
    """All output rows of a recorded output file: (table or None, messages, undecodable,
    work_total from the schema metadata when present)."""
    tables, messages, undecodable, work_total = [], 0, 0, None
    for _rec, t in read_outputs(path):
        messages += 1
        if t is None or "score" not in t.schema.names:
            undecodable += 1
            continue
        meta = t.schema.metadata or {}
        if work_total is None and b"work_total" in meta:
            work_total = int(meta[b"work_total"])
        # the summary reads no ids: messages whose ids differ in type concatenate all the same
        keep = [c for c in ("score", "work_units", "decision", "stop_reason")
                if c in t.schema.names]
        tables.append(t.select(keep).replace_schema_metadata(None))
    table = pa.concat_tables(tables, promote_options="permissive") if tables else None
    return table, messages, undecodable, work_total


def _column(table: pa.Table | None, name: str, dtype) -> np.ndarray:
    if table is None or name not in table.schema.names:
        return np.empty(0, dtype=dtype)
    return np.asarray(table.column(name).to_numpy(), dtype=dtype)


def _stop_reasons(table: pa.Table | None) -> dict[str, int]:
    if table is None or "stop_reason" not in table.schema.names:
        return {}
    counts: Counter[str] = Counter()
    for chunk in table.column("stop_reason").chunks:
        if pa.types.is_dictionary(chunk.type):
            codes = chunk.indices.to_numpy(zero_copy_only=False)
            names = chunk.dictionary.to_pylist()
            for code, n in zip(*np.unique(codes, return_counts=True), strict=True):
                counts[str(names[int(code)])] += int(n)
        else:
            counts.update(str(x) for x in chunk.to_pylist())
    return dict(counts.most_common())


def summarize(output_path: str | Path, model_work_total: int | None = None,
              elapsed_s: float | None = None, png_path: str | Path | None = None,
              thresholds=(0.5,), dead_letters: int | None = None) -> Summary:
    """Summarize a scored output file; write the histograms to ``png_path`` when given.

    ``model_work_total`` defaults to the ``work_total`` in the outputs' schema metadata.
    ``decision`` is counted per band of ``thresholds`` (as the worker wrote it).
    """
    table, messages, undecodable, meta_total = read_output(output_path)
    work_total = model_work_total if model_work_total is not None else meta_total
    score = _column(table, "score", np.float64)
    work = _column(table, "work_units", np.int64)
    decision = _column(table, "decision", np.int64)
    labels = band_labels(thresholds)
    counts = np.bincount(np.clip(decision, 0, len(labels) - 1), minlength=len(labels)) \
        if decision.size else np.zeros(len(labels), dtype=np.int64)
    quantiles = {}
    finite = score[np.isfinite(score)]
    if finite.size:
        qs = np.quantile(finite, [0.5, 0.99, 0.999])
        quantiles = {k: float(v) for k, v in zip(("p50", "p99", "p99.9"), qs, strict=True)}
    summary = Summary(
        records=int(score.size), messages=messages, elapsed_s=elapsed_s, work_total=work_total,
        mean_work_units=float(work.mean()) if work.size else 0.0,
        stop_reasons=_stop_reasons(table), thresholds=sorted(float(x) for x in thresholds),
        decisions={label: int(c) for label, c in zip(labels, counts, strict=True)},
        dead_letters=dead_letters, undecodable=undecodable, score_quantiles=quantiles,
    )
    if png_path is not None:
        summary.png_path = plot(score, work, png_path, summary.thresholds, work_total)
    return summary


class ScoreSample:
    """A uniform sample of (score, work units) pairs of a run (reservoir sampling, Vitter's
    algorithm R, vectorised per batch): the run summary's quantiles and histograms in bounded
    memory, however long the run."""

    def __init__(self, capacity: int = 1 << 16, seed: int = 0):
        self.capacity = capacity
        self.seen = 0
        self.score = np.empty(capacity, dtype=np.float64)
        self.work = np.empty(capacity, dtype=np.int64)
        self._rng = np.random.default_rng(seed)

    def add(self, score: np.ndarray, work: np.ndarray) -> None:
        n = len(score)
        free = min(max(self.capacity - self.seen, 0), n)
        if free:
            self.score[self.seen:self.seen + free] = score[:free]
            self.work[self.seen:self.seen + free] = work[:free]
        if n > free:
            # item k of the run (1-based) replaces a random slot with probability capacity / k
            k = self.seen + np.arange(free + 1, n + 1, dtype=np.float64)
            take = np.flatnonzero(self._rng.random(n - free) < self.capacity / k) + free
            slots = self._rng.integers(0, self.capacity, take.size)
            self.score[slots] = score[take]
            self.work[slots] = work[take]
        self.seen += n

    @property
    def values(self) -> tuple[np.ndarray, np.ndarray]:
        m = min(self.seen, self.capacity)
        return self.score[:m], self.work[:m]


def summary_of_run(records: int, messages: int, elapsed_s: float, work_total: int,
                   work_units: int, thresholds, stop_reasons: dict, decisions: dict,
                   dead_letters: int, sample: ScoreSample, png_path: str | Path | None = None
                   ) -> tuple[Summary, str | None]:
    """The end-of-run summary from the run loop's counts; ``(summary, note)`` where the note
    says why no PNG was written (matplotlib is an optional extra)."""
    labels = band_labels(thresholds)
    score, work = sample.values
    finite = score[np.isfinite(score)]
    quantiles = {}
    if finite.size:
        qs = np.quantile(finite, [0.5, 0.99, 0.999])
        quantiles = {k: float(v) for k, v in zip(("p50", "p99", "p99.9"), qs, strict=True)}
    summary = Summary(
        records=records, messages=messages, elapsed_s=elapsed_s, work_total=work_total,
        mean_work_units=work_units / records if records else 0.0,
        stop_reasons=dict(Counter(stop_reasons).most_common()),
        thresholds=sorted(float(x) for x in thresholds),
        decisions={label: int(decisions.get(i, 0)) for i, label in enumerate(labels)},
        dead_letters=dead_letters, score_quantiles=quantiles)
    note = None
    if png_path is not None and records:
        try:
            summary.png_path = plot(score, work, png_path, summary.thresholds, work_total,
                                    records)
        except ImportError:
            note = ("no histogram PNG: matplotlib is not installed "
                    "(pip install 'scoring-worker[plot]')")
    return summary, note


def plot(score: np.ndarray, work: np.ndarray, png_path: str | Path, thresholds=(),
         work_total: int | None = None, records: int | None = None) -> Path:
    """Two histograms side by side: scores (log y, thresholds marked) and work units.
    ``records``: the run's rows when ``score`` and ``work`` are a sample of them."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_s, ax_w) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    finite = score[np.isfinite(score)]
    if finite.size:
        lo, hi = (0.0, 1.0) if finite.min() >= 0 and finite.max() <= 1 else (finite.min(),
                                                                                 finite.max())
        ax_s.hist(finite, bins=50, range=(lo, hi if hi > lo else lo + 1), log=True,
                  color="tab:blue")
    for t in thresholds:
        ax_s.axvline(t, color="tab:red", linestyle="--", linewidth=1)
    sampled = records is not None and records > score.size
    what = (f"a uniform sample of {score.size:,} of {records:,} records" if sampled
            else f"{finite.size:,} records")
    ax_s.set(title=f"scores ({what})", xlabel="score", ylabel="records (log)")
    if work.size:
        top = max(int(work.max()), int(work_total or 0))
        bins = np.arange(0, top + 2) - 0.5 if top <= 200 else 50
        ax_w.hist(work, bins=bins, color="tab:green")
    if work_total:
        ax_w.axvline(work_total, color="grey", linestyle=":", linewidth=1)
    ax_w.set(title="work units per record" + (f" (of {work_total})" if work_total else "")
             + (" (sample)" if sampled else ""),
             xlabel="trees / boosting rounds evaluated", ylabel="records")
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
