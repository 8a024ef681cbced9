"""Every bound the configuration reference (docs/configuration.md) states (its `range` column),
tried at its edges: the bound itself is accepted, one past it is refused naming the key, as a
config file would be (exit 2). The page is read as committed, so a bound that moves in the code
and not in the docs, or the other way, fails here (issue 55; tests/BOUNDS.md)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from worker.config import ConfigError, load_settings

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def _documented() -> list[tuple[str, str, str]]:
    """(key, default, range) of each row of the reference that states a range."""
    text = PAGE.read_text()
    block = text[text.index("<!-- config-reference:begin -->"):
                 text.index("<!-- config-reference:end -->")]
    rows = []
    for line in block.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and cells[0].startswith("`") and cells[3]:
            rows.append((cells[0].strip("`"), cells[2].strip("`"), cells[3]))
    return rows


ROWS = _documented()
SOURCE = {"type": "file", "path": "in.arrows"}


def _settings(key: str, value):
    *sections, name = key.split(".")
    base = {"model": {"path": "m.model"}, "source": dict(SOURCE)}
    at = base
    for section in sections:  # scoring.explain.top_k: an optional section, set
        at = at.setdefault(section, {})
    at[name] = value
    if key == "delivery.memory_budget_mb":  # the batch bound must fit an eighth of it
        base["delivery"]["max_batch_bytes"] = 1 << 20
    if key == "scoring.audit_fraction":  # an audit compares a lazy policy with the full model
        base["scoring"]["lazy"] = {"mode": "certified"}
    if key == "monitoring.topic":  # window records go to the sink's brokers
        base["sink"] = {"type": "kafka", "topic": "scores"}
        base["kafka"] = {"bootstrap_servers": "localhost:9092"}
    return load_settings(None, **base)


def _edges(rng: str):
    """(value at the bound, value one past it) for each end the range states."""
    above = re.fullmatch(r"`> (\S+?)(?:, <= (\S+))?`", rng)
    if above:  # an open lower end: the bound itself is refused, the next value taken
        lo, hi = above.group(1), above.group(2)
        v = float(lo) if "." in lo else int(lo)
        edges = [(math.nextafter(v, math.inf) if isinstance(v, float) else v + 1, v)]
        if hi is not None:
            w = float(hi) if "." in hi or isinstance(v, float) else int(hi)
            edges.append((w, math.nextafter(w, math.inf) if isinstance(w, float) else w + 1))
        return edges
    m = re.fullmatch(r"`(?:(\S+) \.\. (\S+)|>= (\S+)|<= (\S+))`( characters)?", rng)
    assert m, rng
    lo, hi = m.group(1) or m.group(3), m.group(2) or m.group(4)
    if m.group(5):  # a text's length (a lower bound alone: scoring.id_column's >= 1)
        return [("x" * int(b), "x" * (int(b) + step)) for b, step in ((lo, -1), (hi, 1))
                if b is not None]
    edges = []
    for bound, up in ((lo, False), (hi, True)):
        if bound is None:
            continue
        if "." in bound:
            v = float(bound)
            edges.append((v, math.nextafter(v, math.inf if up else -math.inf)))
        else:
            v = int(bound)
            edges.append((v, v + 1 if up else v - 1))
    return edges


def test_the_reference_states_the_bounds_it_should():
    keys = {k for k, _, _ in ROWS}
    assert len(ROWS) >= 20
    assert {"delivery.memory_budget_mb", "serve.max_rows", "serve.max_header_bytes",
            "serve.keepalive_timeout_ms", "delivery.stop_timeout_ms", "serve.name"} <= keys


def _get(settings, key: str):
    for part in key.split("."):
        settings = getattr(settings, part)
    return settings


@pytest.mark.parametrize("key,default,rng", ROWS, ids=[r[0] for r in ROWS])
def test_each_documented_bound_at_its_edge(key, default, rng):
    for at, past in _edges(rng):
        assert _get(_settings(key, at), key) == at
        with pytest.raises(ConfigError, match=re.escape(key)):
            _settings(key, past)


@pytest.mark.parametrize("key,default,rng", ROWS, ids=[r[0] for r in ROWS])
def test_each_documented_default_is_the_default(key, default, rng):
    sections = key.split(".")[:-1]
    base = {"model": {"path": "m.model"}, "source": dict(SOURCE)}
    if len(sections) == 2:  # an optional section (scoring.explain), set with nothing in it
        base.setdefault(sections[0], {})[sections[1]] = {}
    assert repr(_get(load_settings(None, **base), key)) == default


@pytest.mark.parametrize("budget_mb", [256, 1000])
def test_the_message_and_batch_bounds_within_the_memory_budget_at_their_edge(budget_mb):
    # docs/configuration.md: a message at most a quarter of delivery.memory_budget_mb, a batch
    # an eighth
    budget = budget_mb * 1024 * 1024
    for key, most in (("max_message_bytes", budget // 4), ("max_batch_bytes", budget // 8)):
        other = {"max_batch_bytes": 1024} if key == "max_message_bytes" else {}
        ok = load_settings(None, model={"path": "m.model"}, source=dict(SOURCE),
                           delivery={"memory_budget_mb": budget_mb, key: most, **other})
        assert getattr(ok.delivery, key) == most
        with pytest.raises(ConfigError, match=f"delivery.{key}: {most + 1} is more than"):
            load_settings(None, model={"path": "m.model"}, source=dict(SOURCE),
                          delivery={"memory_budget_mb": budget_mb, key: most + 1, **other})
    text = PAGE.read_text()
    assert "default: an eighth of memory_budget_mb, at most a quarter of it" in text
    assert "at most an eighth of memory_budget_mb" in text
