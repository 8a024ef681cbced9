"""A made neighbour for thread-scaling measurements (bench/NOTES.md, "Thread scaling: the
dynamic schedule"): pins itself to a random one of the machine's CPUs, spins 4 ms, sleeps
15-45 ms, and again, until killed. Run it beside a measurement:

    .venv/bin/python bench/neighbour.py &
"""

from __future__ import annotations

import os
import random
import time


def main() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    while True:
        os.sched_setaffinity(0, {random.choice(cpus)})
        end = time.perf_counter() + 0.004
        while time.perf_counter() < end:
            pass
        time.sleep(random.uniform(0.015, 0.045))


if __name__ == "__main__":
    main()
