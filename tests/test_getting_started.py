"""docs/getting-started.md's walkthrough ("Your own model, your own JSON topic") runs as
written: its bash blocks, in order, in one shell, against the local broker (only the brokers'
address, the metrics port and the group id are this run's), and it does what the page says it
does: 200 scores read committed, the one broken event dead-lettered with its reason, the model
swapped without a restart, the worker stopped with exit 0."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests import kafka_util as K
from tests.kafka_broker import delete_topics

PAGE = K.REPO / "docs" / "getting-started.md"
TOPICS = ["payments", "scores", "scores-dlq"]


def walkthrough() -> str:
    text = PAGE.read_text()
    section = text[text.index("## Your own model, your own JSON topic"):]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) >= 10, "the walkthrough's commands are in ```bash blocks"
    return "\n".join(blocks)


@pytest.mark.kafka
def test_the_walkthrough_runs_as_written(tmp_path, kafka_bootstrap):
    script = walkthrough()
    assert "export BOOTSTRAP=localhost:9092" in script and "port: 9464" in script
    script = script.replace("export BOOTSTRAP=localhost:9092",
                            f"export BOOTSTRAP={kafka_bootstrap}")
    script = script.replace("port: 9464", f"port: {K.free_port()}")
    script = script.replace("group_id: payments-scoring",
                            f"group_id: walkthrough-{uuid.uuid4().hex[:8]}")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    delete_topics(admin, TOPICS)  # the page's own names: a run before this one left them
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
           "PYTHONPATH": str(K.REPO)}
    pid_file = tmp_path / "walkthrough" / "worker.pid"
    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    finally:
        # a step that failed left the worker of step 6 running: it is this test's to stop
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        delete_topics(admin, TOPICS)
    log = tmp_path / "walkthrough" / "worker.log"
    worker_log = log.read_text() if log.exists() else ""
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + worker_log[-3000:]
    out = r.stdout
    # 5: the sample checked: the absent geo.km is said
    assert "missing_field" in out
    # 8: every good event scored once, read committed
    m = re.search(r"^(\d+) scores; the first: (\{.*\})$", out, re.M)
    assert m and int(m.group(1)) == 200, out[-3000:]
    assert "'txn_id': 't" in m.group(2) and "'decision':" in m.group(2)
    # 9: the broken one dead-lettered, with its reason and the path to fix
    assert re.search(r"scores-dlq: 1 dead letters, 1 selected", out), out[-3000:]
    assert "'distance_km' (geo.km) is absent" in out
    # 10, 11: swapped without a restart, then drained and stopped
    assert "model swapped" in out
    assert "Traceback" not in worker_log
