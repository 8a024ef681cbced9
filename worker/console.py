"""The console: a progress bar (file sources) or a rate line, and the end-of-run summary."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import structlog

from .config import Settings
from .model.compiled import CompiledModel

if TYPE_CHECKING:
    from .loop import Worker

log = structlog.get_logger("worker")


@contextlib.contextmanager
def progress(settings: Settings, source):
    """A progress bar over messages for file sources; a rate line every 10 s otherwise."""
    total = getattr(source, "total", None)
    if not settings.logging.progress:
        yield None
        return
    if total:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("messages"), TimeRemainingColumn(),
                      transient=False) as bar:
            task = bar.add_task("scoring", total=total)
            yield lambda n, stats: bar.advance(task, n)
        return
    state = {"t": time.monotonic(), "rows": 0}

    def tick(n, stats):
        state["rows"] += stats.rows
        now = time.monotonic()
        if now - state["t"] >= 10:
            log.info("progress", rows_per_s=round(state["rows"] / (now - state["t"])))
            state.update(t=now, rows=0)

    yield tick


def print_summary(settings: Settings, model: CompiledModel, worker: Worker, elapsed: float):
    """The end-of-run summary from the loop's own counts (memory bounded by the sample)."""
    from pathlib import Path

    from rich.console import Console

    from .report import summary_of_run

    t = worker.totals
    png = Path(settings.sink.path).with_suffix(".png")
    s, note = summary_of_run(t.rows, t.messages, elapsed, model.work_total, t.work_units,
                             settings.scoring.thresholds, t.stop_reasons, t.decisions,
                             sum(t.dead.values()), worker.sample, png)
    console = Console(stderr=False)
    console.print(s.table())
    if t.top_reasons:
        from rich.table import Table

        table = Table(title="highest scores and their reasons "
                            f"({settings.scoring.explain.method}, margin space)")
        for col in ("score", "top reasons (feature: attribution)", "bias"):
            table.add_column(col)
        for score, feats, values, bias in t.top_reasons:
            table.add_row(f"{score:.4f}", ", ".join(
                f"{model.feature_names[f]}: {v:+.3f}" for f, v in zip(feats, values,
                                                                       strict=True)),
                f"{bias:+.3f}")
        console.print(table)
    if note:
        print(note)
