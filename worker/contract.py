"""The input contract of a model under a configuration: where each feature the model reads
comes from (an Arrow column, a JSON or Avro path), what kind of value it takes, whether an
event may leave it out and the cast it declares; and a dry run of sample messages through
the real decoder (``scoring-worker check``): per feature, how often it is present, null,
absent, of the wrong type or an unseen category, and the messages that would be
dead-lettered, with why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import Settings
from .formats import InvalidMessage, Message
from .io.records import Record

MAX_EXAMPLES = 3  # dead-lettered messages shown for each reason


@dataclass
class Row:
    """One feature's line of the contract."""

    feature: str
    source: str  # the column or path it is read from
    kind: str  # number, category (its names), hashed category
    required: bool
    cast: str | None


def check_scores(model, scoring) -> None:
    """ValueError naming the setting where ``scoring.thresholds`` cannot band this model's
    scores (outside 0 to 1 for a model whose scores are probabilities), or where
    ``scoring.explain.min_score`` is above every probability."""
    problem = model.threshold_problem(scoring.thresholds)
    if problem is not None:
        raise ValueError(f"scoring.thresholds: {problem}")
    low = scoring.explain.min_score if scoring.explain is not None else None
    if low is not None and low > 1.0 and model.scores_probabilities:  # (below 0: every row)
        raise ValueError(f"scoring.explain.min_score: {low:g} is above 1, and the model's "
                         "scores are probabilities: no row would be explained (a "
                         "percentage: divide it by 100)")


def rows(model, settings: Settings) -> list[Row]:
    """The contract, one ``Row`` a feature (ValueError for settings the model cannot be read
    by, as start-up refuses them)."""
    from .pipeline import reader_for

    check_scores(model, settings.scoring)
    fmt = reader_for(model, settings)
    specs = getattr(fmt, "fields", None)
    cats, hashed = model.categories or {}, getattr(model, "category_hashes", None) or {}
    out = []
    for f in model.feature_names:
        kind = f"category ({len(cats[f])} names)" if f in cats else \
            "category (hashed)" if f in hashed else "number"
        if specs is None:  # Arrow: a column by name
            out.append(Row(f, f"column {f!r}", kind, True, None))
        else:
            spec = specs[f]
            out.append(Row(f, spec.dotted, kind, not spec.optional, spec.cast))
    id_column = settings.scoring.id_column
    if id_column:  # the id: not a feature, but required as one (a typo leaves it null)
        spec = specs.get(id_column) if specs is not None else None
        out.append(Row(f"{id_column} (id)", spec.dotted if spec else f"column {id_column!r}",
                       "id", not (spec and spec.optional), None))
    return out


def table(contract: list[Row], stats: Stats | None = None) -> str:
    """The contract as a text table (with a dry run's rates per feature)."""
    head = ["feature", "read from", "kind", "required", "cast"]
    if stats is not None:
        head += ["present", "null", "absent", "unseen", "refused"]
    lines = [head]
    for r in contract:
        line = [r.feature, r.source, r.kind, "yes" if r.required else "optional", r.cast or "-"]
        if stats is not None:
            line += stats.rates(r.feature)
        lines.append(line)
    widths = [max(len(str(x[i])) for x in lines) for i in range(len(head))]
    text = ["  ".join(str(x[i]).ljust(widths[i]) for i in range(len(head))).rstrip()
            for x in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


@dataclass
class Stats:
    """What a dry run saw: rows read (by the lenient reader: every feature optional), per
    feature its missing values, absent fields and unseen categories, and the messages the
    worker's own reader would dead-letter, by reason."""

    names: list[str]
    messages: int = 0
    rows: int = 0
    missing: np.ndarray | None = None
    absent: np.ndarray | None = None
    unseen: np.ndarray | None = None
    unread: int = 0  # messages not even the lenient reader reads (bad JSON, wrong shape)
    dead: Counter = field(default_factory=Counter)  # reason -> messages
    refused: Counter = field(default_factory=Counter)  # (feature, kind) -> messages
    examples: dict = field(default_factory=dict)  # reason -> [(offset, detail)]

    def __post_init__(self):
        n = len(self.names)
        self.missing, self.absent, self.unseen = (np.zeros(n, np.int64) for _ in range(3))

    def rates(self, feature: str) -> list[str]:
        if feature not in self.names:  # the id: only its refusals
            n = self.refused.get((None, "missing_field"), 0)
            return ["-", "-", "-", "-", f"missing_field {n}" if n else "-"]
        j = self.names.index(feature)
        if not self.rows:
            present = null = absent = unseen = "-"
        else:
            miss, gone, new = (int(a[j]) for a in (self.missing, self.absent, self.unseen))
            present = _pct(self.rows - miss, self.rows)
            null = _pct(miss - gone - new, self.rows)
            absent, unseen = _pct(gone, self.rows), _pct(new, self.rows)
        refused = ", ".join(f"{kind} {n}" for (f, kind), n in sorted(self.refused.items())
                            if f == feature) or "-"
        return [present, null, absent, unseen, refused]

    def never_present(self, contract: list[Row]) -> list[str]:
        """The required features that no row read gave a value (rows were read)."""
        j = {f: i for i, f in enumerate(self.names)}
        return [r.feature for r in contract if r.required and r.feature in j and
                self.rows and self.missing[j[r.feature]] >= self.rows]

    def never_given(self, contract: list[Row]) -> list[str]:
        """Of those, the ones absent from every row: a path (or column) no message has."""
        j = {f: i for i, f in enumerate(self.names)}
        return [f for f in self.never_present(contract) if self.absent[j[f]] >= self.rows]


def _pct(n: int, of: int) -> str:
    return f"{100.0 * n / of:.1f}%"


def sample_values(path: str | Path) -> list[Record]:
    """The sample's messages: a recorded topic (``.arrows``, as ``scoring-worker record``
    writes it) or JSON lines (``.jsonl``/``.ndjson``: one message a line, an event or an
    array of events)."""
    from .io.records import read_messages

    return list(read_messages(path))


def dry_run(model, settings: Settings, records: list[Record]) -> Stats:
    """Each record through the worker's own reader (what it would dead-letter, and why) and
    through a lenient one (every JSON or Avro feature optional: what each event holds)."""
    from .pipeline import Pipeline, missing_counts

    strict = Pipeline(model, settings, "check")
    lenient = strict
    if settings.source.format in ("json", "avro"):
        from .formats.base import Field

        fields = {name: Field(spec.path, True, spec.cast)
                  for name, spec in strict.format.fields.items()}
        lenient = Pipeline(model, settings.model_copy(update={
            "source": settings.source.model_copy(update={"fields": fields})}), "check")
    stats = Stats(list(model.feature_names))
    for rec in records:
        stats.messages += 1
        got = strict.decode(rec)
        if isinstance(got, InvalidMessage):
            stats.dead[got.code] += 1
            if got.feature or got.code in ("missing_field", "schema_mismatch"):
                stats.refused[(got.feature, got.code)] += 1  # (None: the id)
            seen = stats.examples.setdefault(got.code, [])
            if len(seen) < MAX_EXAMPLES:
                seen.append((rec.offset, got.detail[:200]))
        read = got if lenient is strict else lenient.decode(rec)
        if not isinstance(read, Message):
            stats.unread += 1
            continue
        stats.rows += read.rows
        stats.missing += missing_counts(lenient.format.gather([read]), stats.names)
        for kind in ("absent", "unseen"):
            if read.counts and kind in read.counts:
                getattr(stats, kind)[:] += read.counts[kind]
    return stats


def report(contract: list[Row], stats: Stats) -> tuple[str, int]:
    """The dry run's report, and its exit code: 1 where a required feature is never present
    (the worker would score none of it, or dead-letter every message)."""
    out = [table(contract, stats), ""]
    dead = sum(stats.dead.values())
    out.append(f"{stats.messages} messages; the worker would dead-letter {dead}"
               + (":" if dead else "."))
    for code, n in stats.dead.most_common():
        out.append(f"  {code}: {n}")
        for offset, detail in stats.examples.get(code, []):
            out.append(f"    message {offset}: {detail}")
    out.append(f"(the rates above: {stats.rows} rows of the {stats.messages - stats.unread} "
               "messages read with every feature optional and the same casts)")
    never, gone = stats.never_present(contract), stats.never_given(contract)
    if not stats.rows:
        out.append("no message could be read at all: see the reasons above")
    elif never:
        out.append(f"required features never present: {', '.join(never[:20])}"
                   + (f" ({', '.join(gone[:20])}: absent from every message: is the path "
                      "in source.fields right?)" if gone else ""))
    return "\n".join(out), 1 if never or not stats.rows else 0
