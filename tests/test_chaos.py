"""The chaos suite's short forms on the real broker (tests/chaos.py; `make chaos` runs the long
ones): pauses past the session timeout and past max.poll.interval.ms at random moments and at
chosen points, a second worker joining and leaving, partitions added, a fenced zombie, a broker
restart and a model swap during a rebalance, each checked for every id exactly once (at least
once), every score that of the model its output names, and the committed offsets at the
input's end. The seed is random and printed with a failure; CHAOS_SEED=N replays it."""

from __future__ import annotations

import os
import time

import pytest

from tests import chaos
from tests.kafka_broker import BOOTSTRAP_ENV

pytestmark = [pytest.mark.kafka]

SEED = int(os.environ.get("CHAOS_SEED") or time.time())


@pytest.fixture(scope="module")
def chaos_models(tmp_path_factory):
    return chaos.compile_models(tmp_path_factory.mktemp("chaos-models"))


@pytest.mark.parametrize(("scenario", "mode"), [
    # a scenario that restarts the local broker runs alone (tests/run.sh's serial phase)
    pytest.param(s, m, id=f"{s.name}-{m}", marks=[pytest.mark.serial] if s.broker else [])
    for s in chaos.SCENARIOS for m in s.short_modes])
def test_chaos_loses_and_duplicates_nothing(scenario, mode, kafka_bootstrap, chaos_models,
                                            tmp_path):
    if scenario.broker and os.environ.get(BOOTSTRAP_ENV):
        pytest.skip(f"{scenario.name} restarts the local broker; {BOOTSTRAP_ENV} names another")
    seed = SEED + 1000 * chaos.SCENARIOS.index(scenario) + chaos.MODES.index(mode)
    result = chaos.play(scenario, mode, kafka_bootstrap, tmp_path, chaos_models, seed)
    summary = {k: v for k, v in result.items() if k not in ("committed", "ends")}
    assert chaos.passed(result, mode), (
        f"CHAOS_SEED={SEED} replays this run (scenario seed {seed}): {summary}")
