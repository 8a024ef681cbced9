"""Hot-swap pause: the run loop (Worker.run, an endless in-memory source of one-row messages,
a sink that drops what it gets) while bench model A (XGBoost 200 trees depth 5, 64 features)
and model B (500 trees depth 8) are swapped in and out at model.path; the longest gap between
two delivered batches around a swap against the gaps elsewhere (target: at most one batch's
time plus the load, under 50 ms for model A's size).

    .venv/bin/python bench/swap.py [--swaps 10] [--messages 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import models as BM  # noqa: E402

from worker import compile_model  # noqa: E402
from worker.config import load_settings  # noqa: E402
from worker.io.records import Record  # noqa: E402
from worker.lifecycle import ModelWatcher  # noqa: E402
from worker.loop import Worker  # noqa: E402


class EndlessSource:
    total, exhausted = None, False

    def __init__(self, values):
        self.values, self.offset = values, 0

    def poll(self, n, timeout_s):
        out = [Record("in", 0, self.offset + k, None, self.values[(self.offset + k)
                                                               % len(self.values)], 1)
               for k in range(n)]
        self.offset += n
        return out

    def take_revoked(self):

        return False


    def owns(self, rec):

        return True

    def commit(self, batch):
        pass

    def rewind(self):
        pass

    def lag(self):
        return {}


class NullSink:
    topic = "scores"

    def deliver(self, source, batch, outputs, dead):
        assert not dead, dead[0].headers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=10)
    ap.add_argument("--messages", type=int, default=200, help="one-row messages per batch")
    a = ap.parse_args()
    ma, mb = compile_model(BM.load("A").source), compile_model(BM.load("B").source)
    X = BM.data(1000, seed=5)[0].astype(np.float32)
    names = ma.feature_names
    values = []
    for i in range(len(X)):
        t = pa.table({n: pa.array(X[i:i + 1, j]) for j, n in enumerate(names)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        values.append(sink.getvalue().to_pybytes())
    tmp = Path(tempfile.mkdtemp())
    path = tmp / "fraud.model"
    ma.save(path)
    settings = load_settings(None, model={"path": str(path), "reload": True,
                                          "reload_interval_ms": 50},
                             source={"type": "kafka", "topic": "in"},
                             sink={"type": "kafka", "topic": "out"},
                             scoring={"threads": 1, "id_column": None},
                             delivery={"max_batch_messages": a.messages, "max_wait_ms": 1000,
                                       "overlap": False},
                             logging={"progress": False})
    done = []
    w = Worker(settings, ma, EndlessSource(values), NullSink(),
               progress=lambda n, stats: done.append(time.perf_counter()))
    w.watcher = ModelWatcher(str(path), ma, settings, w.metrics).start()
    writes = []

    def swapper():
        time.sleep(2)
        for k in range(a.swaps):
            (mb if k % 2 == 0 else ma).save(path)
            writes.append(time.perf_counter())
            time.sleep(1.5)
        time.sleep(1)
        w.stop()

    threading.Thread(target=swapper, daemon=True).start()
    w.run()
    w.watcher.stop()
    done_arr = np.array(done)
    gaps = np.diff(done_arr)
    near = np.zeros(len(gaps), dtype=bool)
    for t in writes:  # from the file's write to 1 s after (load, verify, warm-up, swap)
        near |= (done_arr[1:] >= t) & (done_arr[:-1] <= t + 1.0)
    swaps = w.swaps
    print(f"{len(done)} batches of {a.messages} one-row messages; {len(swaps)} swaps "
          f"(A<->B: XGBoost 200x5 and 500x8, 64 features)")
    print(f"  swap at the boundary: max {max(s['swap_ms'] for s in swaps):.2f} ms")
    print(f"  batch time elsewhere: median {np.median(gaps[~near]) * 1e3:.1f} ms, p99 "
          f"{np.percentile(gaps[~near], 99) * 1e3:.1f} ms, max {gaps[~near].max() * 1e3:.1f} ms")
    print(f"  longest gap around a swap: {gaps[near].max() * 1e3:.1f} ms (median there "
          f"{np.median(gaps[near]) * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
