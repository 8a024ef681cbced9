"""The bundled demo: synthetic card transactions, two demo models and a recorded input topic.

``python -m worker.demo prepare [--root DIR] [--force]`` writes, under ``DIR`` (default: the
current directory, i.e. the repository root when run from ``make demo``):

- ``models/demo-xgb.json``  XGBoost source model (binary:logistic, 150 rounds, depth 5;
  ``merchant_category`` a categorical feature: partition splits on its codes)
- ``models/demo-xgb.model`` its compiled artifact (``worker.compile_model``)
- ``models/demo-rf.model``  compiled scikit-learn RandomForestClassifier (100 trees, depth 12)
- ``data/demo.arrows``      a recorded ``transactions`` topic (see ``worker.io.records``):
  2000 messages x 50 transactions, three partitions, each value one Arrow IPC stream.

It skips the work when every file exists and is newer than this module (``--force`` redoes it).
Everything is seeded, so two runs on the same library versions give the same files.

The generator (``generate``) draws a legitimate population and overlays about 1 % fraud from
three labelled patterns plus a "stealthy" remainder that looks legitimate:

1. ``card_testing``: card not present, bursts of transactions (high 1 h / 24 h velocity), a
   device first seen days ago, risky IPs, online merchants, often tiny amounts.
2. ``night_foreign``: 00:00-04:59, foreign merchant far from home, large amount relative to the
   customer's average, jewellery / electronics / travel.
3. ``account_takeover``: an established account, recent credential change, failed logins, a new
   device, card not present, gift cards / electronics at several times the usual amount.

Deliberately malformed messages (the dead-letter path), at fixed positions near the fractions
in ``MALFORMED``, one per partition (``malformed_positions``): in the default 2000-message topic

- message  99 (partition 0, offset 33)  ``not_arrow``: a JSON document from a "legacy producer"
  (content-type application/json)
- message 1000 (partition 1, offset 333) ``missing_column``: an Arrow stream without
  ``device_age_days`` (schema drift)
- message 1901 (partition 2, offset 633) ``empty_batch``: the right schema and zero rows

Each replaces the message that would have been at its position, so the default topic holds
1997 valid messages = 99,850 scorable transactions (the ``missing_column`` message's 50 rows go
to the dead-letter topic with it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .codec import CONTENT_TYPE
from .io.records import Record, RecordWriter, read_records

# ---- schema ---------------------------------------------------------------------------------

FEATURE_TYPES: dict[str, pa.DataType] = {
    "amount": pa.float64(),                 # transaction amount (currency units), log-normal
    "merchant_category": pa.int16(),        # merchant category code, see MERCHANT_CATEGORIES
    "hour": pa.int8(),                      # local hour of day 0-23
    "card_present": pa.bool_(),             # chip/contactless at a terminal vs. online
    "velocity_1h": pa.int32(),              # transactions on the card in the previous hour
    "velocity_24h": pa.int32(),             # ... in the previous 24 hours
    "distance_from_home_km": pa.float32(),  # merchant distance from the cardholder's home
    "device_age_days": pa.int32(),          # days since the device was first seen (~3 % null)
    "account_age_days": pa.int32(),         # days since the account was opened
    "foreign_merchant": pa.bool_(),         # merchant country != card country
    "amount_to_avg_ratio": pa.float32(),    # amount / the customer's 90-day average amount
    "failed_logins_24h": pa.uint8(),        # failed online-banking logins in 24 hours
    "credentials_changed_7d": pa.bool_(),   # password / phone / e-mail changed in 7 days
    "ip_risk_score": pa.float32(),          # 0-1 from an IP reputation feed; null when card present
}
FEATURES: list[str] = list(FEATURE_TYPES)
CATEGORICAL = ("merchant_category",)  # the XGBoost demo model splits on sets of its codes
ID_COLUMN = "txn_id"
LABEL = "is_fraud"
SCHEMA = pa.schema([(ID_COLUMN, pa.int64()), *FEATURE_TYPES.items(), (LABEL, pa.bool_())])
MESSAGE_SCHEMA = pa.schema([(ID_COLUMN, pa.int64()), *FEATURE_TYPES.items()])

MERCHANT_CATEGORIES = [
    "grocery", "fuel", "restaurants", "fast_food", "pharmacy", "clothing", "home_improvement",
    "electronics", "online_retail", "jewelry", "travel", "gift_cards", "digital_goods",
    "entertainment", "utilities", "transport", "hotels", "health", "education", "cash_advance",
]
_MCC = {name: i for i, name in enumerate(MERCHANT_CATEGORIES)}
_MCC_WEIGHTS = np.array([18, 9, 12, 10, 5, 6, 4, 3, 10, 1, 2, 1, 4, 4, 3, 4, 1, 2, 0.5, 0.5])
_ONLINE = np.isin(np.arange(len(MERCHANT_CATEGORIES)),
                  [_MCC[c] for c in ("online_retail", "digital_goods", "gift_cards", "utilities",
                                     "education", "entertainment")])
# hour-of-day shape of legitimate card spending: quiet nights, lunch and evening peaks
_HOUR_WEIGHTS = np.array([1.0, 0.6, 0.4, 0.3, 0.3, 0.5, 1.2, 2.5, 4, 5, 5.5, 6.5,
                          8, 7, 6, 6, 6.5, 7.5, 8, 7, 5.5, 4, 3, 2])

PATTERNS = ["card_testing", "night_foreign", "account_takeover", "stealthy"]
FRAUD_RATE = 0.0105
_PATTERN_WEIGHTS = np.array([0.40, 0.27, 0.23, 0.10])

# ---- demo layout ----------------------------------------------------------------------------

TOPIC = "transactions"
N_PARTITIONS = 3
TRAIN_SEED = 20240601
TOPIC_SEED = 20240901  # a different stream from the training data
TRAIN_ROWS = 200_000
DEMO_MESSAGES = 2000
DEMO_ROWS_PER_MESSAGE = 50
BASE_TIMESTAMP_MS = 1_725_148_800_000  # 2024-09-01T00:00:00Z
MALFORMED = {0.05: "not_arrow", 0.50: "missing_column", 0.95: "empty_batch"}
DROPPED_COLUMN = "device_age_days"

XGB_SOURCE = Path("models/demo-xgb.json")
XGB_MODEL = Path("models/demo-xgb.model")
RF_MODEL = Path("models/demo-rf.model")
DEMO_TOPIC = Path("data/demo.arrows")
DEMO_JSON_TOPIC = Path("data/demo-json.arrows")  # the same transactions as JSON events


# ---- generator ------------------------------------------------------------------------------

def generate(n: int, seed: int, first_id: int = 1) -> pa.Table:
    """``n`` synthetic card transactions with an ``is_fraud`` label (about 1 % positives).

    Deterministic per ``seed``. Columns: ``txn_id`` (int64, ``first_id`` upwards), the
    ``FEATURES`` in their ``FEATURE_TYPES`` (``device_age_days`` ~3 % null, ``ip_risk_score``
    null for card-present transactions), then ``is_fraud`` (bool).
    """
    rng = np.random.default_rng(seed)
    f = _legitimate(rng, n)
    fraud = rng.random(n) < FRAUD_RATE
    pattern = np.where(fraud, rng.choice(len(PATTERNS), size=n, p=_PATTERN_WEIGHTS), -1)
    for k, name in enumerate(PATTERNS):
        rows = np.flatnonzero(pattern == k)
        if rows.size:
            _OVERLAYS[name](rng, f, rows)
    # derived and missing values last, so they follow the overlays
    f["velocity_24h"] = np.maximum(f["velocity_24h"], f["velocity_1h"])
    f["amount"] = np.round(np.clip(f["amount"], 0.5, 25_000.0), 2)
    device_null = rng.random(n) < np.where(fraud, 0.06, 0.03)  # fraudsters block fingerprinting
    ip_null = f["card_present"] & (rng.random(n) < 0.97)
    cols = {ID_COLUMN: pa.array(np.arange(first_id, first_id + n, dtype=np.int64))}
    for name, typ in FEATURE_TYPES.items():
        mask = device_null if name == "device_age_days" else (
            ip_null if name == "ip_risk_score" else None)
        values = f[name].astype(typ.to_pandas_dtype())
        cols[name] = pa.array(values, type=typ, mask=mask)
    cols[LABEL] = pa.array(fraud)
    return pa.table(cols, schema=SCHEMA)


def _legitimate(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    mcc = rng.choice(len(MERCHANT_CATEGORIES), size=n, p=_MCC_WEIGHTS / _MCC_WEIGHTS.sum())
    online = _ONLINE[mcc]
    card_present = np.where(online, rng.random(n) < 0.03, rng.random(n) < 0.88)
    foreign = rng.random(n) < np.where(mcc == _MCC["travel"], 0.35, 0.035)
    distance = rng.lognormal(1.7, 1.1, n)
    distance = np.where(foreign, distance + rng.lognormal(6.5, 1.0, n), distance)
    avg_amount = rng.lognormal(3.7, 0.8, n)  # the customer's usual ticket
    ratio = rng.lognormal(0.0, 0.55, n)
    ratio = np.where(np.isin(mcc, [_MCC["travel"], _MCC["hotels"], _MCC["electronics"]]),
                     ratio * rng.lognormal(0.8, 0.5, n), ratio)
    v1 = rng.poisson(0.35, n)
    v1 = np.where(rng.random(n) < 0.01, v1 + rng.poisson(4, n), v1)  # shopping sprees
    return {
        "amount": avg_amount * ratio,
        "merchant_category": mcc,
        "hour": rng.choice(24, size=n, p=_HOUR_WEIGHTS / _HOUR_WEIGHTS.sum()),
        "card_present": card_present,
        "velocity_1h": v1,
        "velocity_24h": v1 + rng.poisson(2.8, n),
        "distance_from_home_km": distance,
        # a mix of long-lived phones/browsers and recently seen ones (new phone, new laptop)
        "device_age_days": np.where(rng.random(n) < 0.07, rng.integers(0, 14, n),
                                    rng.gamma(1.6, 260.0, n).astype(np.int64) + 14),
        "account_age_days": np.clip(rng.gamma(2.0, 650.0, n), 3, 9000).astype(np.int64),
        "foreign_merchant": foreign,
        "amount_to_avg_ratio": ratio,
        "failed_logins_24h": np.where(rng.random(n) < 0.03, rng.integers(1, 4, n), 0),
        "credentials_changed_7d": rng.random(n) < 0.012,
        "ip_risk_score": rng.beta(1.2, 14.0, n),
    }


def _card_testing(rng, f, rows):
    k = rows.size
    f["card_present"][rows] = False
    f["merchant_category"][rows] = rng.choice(
        [_MCC["online_retail"], _MCC["digital_goods"], _MCC["gift_cards"], _MCC["electronics"]],
        size=k, p=[0.35, 0.35, 0.15, 0.15])
    f["velocity_1h"][rows] = 3 + rng.poisson(5, k)
    f["velocity_24h"][rows] = f["velocity_1h"][rows] + rng.poisson(8, k)
    f["device_age_days"][rows] = rng.integers(0, 4, k)
    f["ip_risk_score"][rows] = rng.beta(4.0, 3.0, k)
    avg = f["amount"][rows] / f["amount_to_avg_ratio"][rows]
    tiny = rng.random(k) < 0.45  # probing with small amounts before the big one
    amount = np.where(tiny, rng.uniform(0.5, 3.0, k), avg * rng.lognormal(1.0, 0.7, k))
    f["amount"][rows] = amount
    f["amount_to_avg_ratio"][rows] = amount / avg


def _night_foreign(rng, f, rows):
    k = rows.size
    f["hour"][rows] = rng.integers(0, 5, k)
    f["foreign_merchant"][rows] = True
    f["distance_from_home_km"][rows] = rng.lognormal(7.3, 0.7, k)
    f["merchant_category"][rows] = rng.choice(
        [_MCC["jewelry"], _MCC["electronics"], _MCC["travel"], _MCC["cash_advance"]], size=k)
    f["card_present"][rows] = rng.random(k) < 0.5  # cloned card at a terminal, or online
    ratio = rng.lognormal(1.9, 0.5, k)
    f["amount"][rows] *= ratio / f["amount_to_avg_ratio"][rows]
    f["amount_to_avg_ratio"][rows] = ratio


def _account_takeover(rng, f, rows):
    k = rows.size
    f["credentials_changed_7d"][rows] = rng.random(k) < 0.8
    f["failed_logins_24h"][rows] = 2 + rng.poisson(2.5, k)
    f["device_age_days"][rows] = rng.integers(0, 3, k)
    f["account_age_days"][rows] = 365 + rng.gamma(2.0, 700.0, k).astype(np.int64)
    f["card_present"][rows] = False
    f["merchant_category"][rows] = rng.choice(
        [_MCC["gift_cards"], _MCC["electronics"], _MCC["online_retail"], _MCC["jewelry"]],
        size=k, p=[0.35, 0.3, 0.25, 0.1])
    ratio = rng.lognormal(1.7, 0.5, k)
    f["amount"][rows] *= ratio / f["amount_to_avg_ratio"][rows]
    f["amount_to_avg_ratio"][rows] = ratio
    f["ip_risk_score"][rows] = rng.beta(2.5, 4.0, k)


def _stealthy(rng, f, rows):
    """Fraud that mostly looks legitimate: a nudge up in amount and velocity, nothing more."""
    k = rows.size
    nudge = rng.lognormal(0.4, 0.4, k)
    f["amount_to_avg_ratio"][rows] *= nudge
    f["amount"][rows] *= nudge
    f["velocity_1h"][rows] += rng.poisson(0.8, k)


_OVERLAYS = {"card_testing": _card_testing, "night_foreign": _night_foreign,
             "account_takeover": _account_takeover, "stealthy": _stealthy}


def feature_matrix(table: pa.Table | pa.RecordBatch, names: list[str] | None = None) -> np.ndarray:
    """The feature columns as a float32 (n, n_features) matrix; nulls become NaN, bools 0/1."""
    names = names or FEATURES
    out = np.empty((table.num_rows, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        col = pc.cast(table.column(name), pa.float64())
        out[:, j] = col.to_numpy(zero_copy_only=False) if isinstance(col, pa.Array) \
            else np.concatenate([c.to_numpy(zero_copy_only=False) for c in col.chunks]
                                or [np.empty(0)])
    return out


# ---- models ---------------------------------------------------------------------------------

def split(table: pa.Table, holdout: float = 0.2, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """A seeded random train / held-out split of rows."""
    rng = np.random.default_rng(seed)
    test = rng.random(table.num_rows) < holdout
    return table.filter(pa.array(~test)), table.filter(pa.array(test))


def train_xgboost(table: pa.Table, rounds: int = 150, max_depth: int = 5, seed: int = 0,
                  n_threads: int = 1):
    import xgboost as xgb

    y = table.column(LABEL).to_numpy(zero_copy_only=False).astype(np.float32)
    # merchant_category is categorical: its splits send sets of categories left or right
    types = ["c" if name in CATEGORICAL else "q" for name in FEATURES]
    dm = xgb.DMatrix(feature_matrix(table), label=y, feature_names=FEATURES, missing=np.nan,
                     feature_types=types, enable_categorical=True)
    params = {"objective": "binary:logistic", "max_depth": max_depth, "eta": 0.1,
              "subsample": 0.8, "colsample_bytree": 0.8, "min_child_weight": 2,
              "tree_method": "hist", "seed": seed, "max_cat_to_onehot": 1,
              # one thread: 3 s for the demo; two OpenMP threads took 13 s on a busy 2-core box
              "nthread": n_threads}
    return xgb.train(params, dm, num_boost_round=rounds)


def train_random_forest(table: pa.Table, n_estimators: int = 100, max_depth: int = 12,
                        seed: int = 0, n_jobs: int = -1, max_samples: float | None = 0.5):
    """RandomForestClassifier fitted on a pyarrow Table so that it carries feature names."""
    from sklearn.ensemble import RandomForestClassifier

    X = feature_matrix(table)
    named = pa.table({name: X[:, j] for j, name in enumerate(FEATURES)})
    y = table.column(LABEL).to_numpy(zero_copy_only=False).astype(np.int8)
    rf = RandomForestClassifier(n_estimators=n_estimators, max_depth=max_depth,
                                min_samples_leaf=3, max_samples=max_samples, n_jobs=n_jobs,
                                random_state=seed)
    return rf.fit(named, y)


def train_models(table: pa.Table, out_dir: str | Path, xgb_rounds: int = 150,
                 rf_trees: int = 100, rf_depth: int = 12, seed: int = 0,
                 holdout: float = 0.2, progress=None) -> dict:
    """Train the demo XGBoost and RandomForest models on ``table`` (minus a held-out share),
    save ``models/demo-xgb.json`` and compile both into ``models/demo-{xgb,rf}.model`` under
    ``out_dir``. Returns paths, compiled models, the held-out split and held-out ROC-AUCs."""
    from sklearn.metrics import roc_auc_score

    from .model.compile import compile_model

    out = Path(out_dir)
    (out / "models").mkdir(parents=True, exist_ok=True)
    train, test = split(table, holdout, seed)
    step = _steps(progress, 4)
    with step("training XGBoost"):
        booster = train_xgboost(train, rounds=xgb_rounds, seed=seed)
        booster.save_model(str(out / XGB_SOURCE))
    with step("training RandomForest"):
        rf = train_random_forest(train, n_estimators=rf_trees, max_depth=rf_depth, seed=seed)
    with step("compiling models"), warnings.catch_warnings():
        # the RF was fitted with feature names; the compiler's exactness probe uses numpy rows
        warnings.filterwarnings("ignore", message="X does not have valid feature names")
        xgb_model = compile_model(out / XGB_SOURCE)
        rf_model = compile_model(rf)
        xgb_model.save(out / XGB_MODEL)
        rf_model.save(out / RF_MODEL)
    with step("evaluating on held-out rows"):
        y = test.column(LABEL).to_numpy(zero_copy_only=False)
        has_both = 0 < y.sum() < len(y)
        auc = {name: float(roc_auc_score(y, m.predict_proba(test)[:, 1])) if has_both
               else float("nan") for name, m in (("xgb", xgb_model), ("rf", rf_model))}
    return {"xgb_source": out / XGB_SOURCE, "xgb_model": out / XGB_MODEL,
            "rf_model": out / RF_MODEL, "xgb": xgb_model, "rf": rf_model,
            "booster": booster, "sklearn_rf": rf, "train": train, "test": test, "auc": auc}


# ---- recorded topic -------------------------------------------------------------------------

def arrow_stream(batch: pa.RecordBatch | pa.Table) -> bytes:
    """One self-contained Arrow IPC stream (schema + batches) as bytes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        if isinstance(batch, pa.Table):
            writer.write_table(batch)
        else:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def malformed_positions(n_messages: int) -> dict[int, str]:
    """Message index -> kind of deliberate defect. The k-th kind sits near fraction ``f`` of
    the topic (see MALFORMED), moved down to partition k: 99, 1000, 1901 of 2000 messages."""
    if n_messages < 2 * N_PARTITIONS:
        return {}
    out = {}
    for k, (frac, kind) in enumerate(MALFORMED.items()):
        pos = int(frac * n_messages) // N_PARTITIONS * N_PARTITIONS + k % N_PARTITIONS
        out[pos if pos < n_messages else pos - N_PARTITIONS] = kind
    return out


def _card_key(txn_id: int) -> bytes:
    """The card of a batch's first transaction (a fixed hash of its id onto 100k cards)."""
    return b"card-%05d" % ((txn_id * 2654435761) % 100_000)


def demo_messages(n_messages: int = DEMO_MESSAGES, rows_per_message: int = DEMO_ROWS_PER_MESSAGE,
                  seed: int = TOPIC_SEED, malformed: bool = True) -> Iterator[Record]:
    """The records of the demo topic, in production order (partitions interleaved)."""
    table = generate(n_messages * rows_per_message, seed).select(MESSAGE_SCHEMA.names)
    batch = pa.RecordBatch.from_arrays(
        [c.combine_chunks() for c in table.columns], schema=MESSAGE_SCHEMA)
    bad = malformed_positions(n_messages) if malformed else {}
    rng = np.random.default_rng(seed + 1)
    gaps = 1 + rng.exponential(30.0, n_messages).astype(np.int64)  # ms between messages
    timestamps = BASE_TIMESTAMP_MS + np.cumsum(gaps)
    offsets = [0] * N_PARTITIONS
    arrow_header = [("content-type", CONTENT_TYPE.encode())]
    for i in range(n_messages):
        part = i % N_PARTITIONS
        rows = batch.slice(i * rows_per_message, rows_per_message)
        first_id = int(rows.column(0)[0].as_py()) if rows.num_rows else i
        headers = arrow_header
        kind = bad.get(i)
        if kind == "not_arrow":
            row = {k: v for k, v in rows.slice(0, 1).to_pylist()[0].items()}
            value = json.dumps(row).encode()
            headers = [("content-type", b"application/json")]
        elif kind == "missing_column":
            value = arrow_stream(rows.drop_columns([DROPPED_COLUMN]))
        elif kind == "empty_batch":
            value = arrow_stream(rows.slice(0, 0))
        else:
            value = arrow_stream(rows)
        yield Record(topic=TOPIC, partition=part, offset=offsets[part], key=_card_key(first_id),
                     value=value, timestamp_ms=int(timestamps[i]), headers=list(headers))
        offsets[part] += 1


def json_messages(records: Iterable[Record]) -> Iterator[Record]:
    """The demo topic's messages as a JSON producer sends them: each message an array of its
    transactions (missing values as null), one object where a message holds one; the
    message that is not Arrow in the Arrow topic is a truncated JSON event here, the one
    without a column lacks that key (dead-lettered missing_field, as the Arrow one is
    missing_column), the empty one is ``[]``."""
    for rec in records:
        ctype = dict(rec.headers).get("content-type")
        if ctype == b"application/json":  # the deliberately malformed one: cut short
            value = rec.value[: len(rec.value) // 2]
        else:
            rows = pa.ipc.open_stream(rec.value).read_all().to_pylist()
            events = [{k: (None if isinstance(v, float) and v != v else v)
                       for k, v in row.items()} for row in rows]
            value = json.dumps(events[0] if len(events) == 1 else events).encode()
        yield Record(rec.topic, rec.partition, rec.offset, rec.key, value, rec.timestamp_ms,
                     [("content-type", b"application/json")])


def write_demo_topic(path: str | Path, n_messages: int = DEMO_MESSAGES,
                     rows_per_message: int = DEMO_ROWS_PER_MESSAGE, seed: int = TOPIC_SEED,
                     progress=None) -> int:
    """Write the recorded demo topic (``worker.io.records`` format); returns messages written."""
    task = progress.add_task("writing demo topic", total=n_messages) if progress else None
    with RecordWriter(path) as writer:
        buf: list[Record] = []
        for rec in demo_messages(n_messages, rows_per_message, seed):
            buf.append(rec)
            if len(buf) >= 500:
                writer.write(buf)
                if progress:
                    progress.advance(task, len(buf))
                buf = []
        writer.write(buf)
        if progress:
            progress.advance(task, len(buf))
        return writer.count


# ---- command line ---------------------------------------------------------------------------

def _steps(progress, total: int):
    task = progress.add_task("", total=total) if progress else None

    @contextmanager
    def step(description: str):
        if progress:
            progress.update(task, description=description)
        yield
        if progress:
            progress.advance(task)

    return step


def _progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), transient=False)


def outputs(root: str | Path) -> list[Path]:
    root = Path(root)
    return [root / p for p in (XGB_SOURCE, XGB_MODEL, RF_MODEL, DEMO_TOPIC, DEMO_JSON_TOPIC)]


def is_prepared(root: str | Path) -> bool:
    """Every demo file exists, is newer than this module (the generator's definition), and
    the compiled models are in the artifact format this build reads."""
    from .model import artifact

    source_mtime = Path(__file__).stat().st_mtime
    if not all(p.exists() and p.stat().st_mtime >= source_mtime for p in outputs(root)):
        return False
    for p in outputs(root):
        if p.suffix == ".model" and artifact.format_version(p) != artifact.FORMAT_VERSION:
            return False
    return True


def prepare(root: str | Path = ".", force: bool = False, train_rows: int = TRAIN_ROWS,
            n_messages: int = DEMO_MESSAGES, rows_per_message: int = DEMO_ROWS_PER_MESSAGE,
            console=None) -> dict | None:
    """Generate the demo models and topic under ``root``; None when they were already there."""
    from rich.console import Console

    console = console or Console(stderr=True)
    root = Path(root)
    if not force and is_prepared(root):
        console.print(f"demo data already prepared under {root.resolve()} (--force to redo)")
        return None
    t0 = time.perf_counter()
    with _progress() as progress:
        step = _steps(progress, 1)
        with step(f"generating {train_rows:,} training transactions"):
            table = generate(train_rows, TRAIN_SEED)
        result = train_models(table, root, progress=progress)
        (root / DEMO_TOPIC).parent.mkdir(parents=True, exist_ok=True)
        tmp = (root / DEMO_TOPIC).with_suffix(".arrows.tmp")
        n = write_demo_topic(tmp, n_messages, rows_per_message, TOPIC_SEED, progress=progress)
        tmp.replace(root / DEMO_TOPIC)  # a half-written topic never looks prepared
        tmp = (root / DEMO_JSON_TOPIC).with_suffix(".arrows.tmp")
        with RecordWriter(tmp) as writer:
            writer.write(list(json_messages(read_records(root / DEMO_TOPIC))))
        tmp.replace(root / DEMO_JSON_TOPIC)
    rate = pc.mean(pc.cast(table.column(LABEL), pa.float64())).as_py()
    bad = malformed_positions(n_messages)
    result.update(messages=n, positive_rate=rate, seconds=time.perf_counter() - t0,
                  malformed=bad)
    console.print(
        f"[bold]demo prepared[/] in {result['seconds']:.1f} s under {root.resolve()}\n"
        f"  training rows {train_rows:,} ({rate:.2%} fraud); held-out ROC-AUC "
        f"xgb {result['auc']['xgb']:.4f}, rf {result['auc']['rf']:.4f}\n"
        f"  {XGB_MODEL} ({result['xgb'].work_total} trees), {RF_MODEL} "
        f"({result['rf'].work_total} trees)\n"
        f"  {DEMO_TOPIC}: {n:,} messages x {rows_per_message} rows on {N_PARTITIONS} partitions, "
        f"malformed at " + ", ".join(f"#{i} ({k})" for i, k in sorted(bad.items())))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.demo", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="train the demo models and write the demo topic")
    p.add_argument("--root", default=".", help="directory to write models/ and data/ under")
    p.add_argument("--force", action="store_true", help="regenerate even if the files exist")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.root, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
