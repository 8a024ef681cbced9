"""make chaos: the chaos suite's long forms (tests/chaos.py) on the local broker, and the table
in bench/CHAOS-RESULTS.md.

    .venv/bin/python bench/chaos.py [--seed N] [--scenario NAME ...] [--mode MODE ...]
                                    [--before REV] [--out bench/CHAOS-RESULTS.md]

The local single-node broker is started (and stopped at the end if this run started it); the
network scenarios (``net-*``) run on the three-node cluster through Toxiproxy, both started
for them (``make chaos-network``: ``--scenario net-... --out bench/NETWORK-RESULTS.md``).
``--before REV`` first runs ``pause`` (SIGSTOP at random moments: the scenario of issue 37,
the only one code without the pause points of worker/chaos.py can take) with the workers of
commit REV, from a worktree under out/chaos/before with its own extensions built
(bench/worktree.py), to show what the fix changed. Rows and the machine
go to the .json beside --out.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))

from tests import chaos  # noqa: E402
from tests.kafka_broker import BROKER_SCRIPT, start_local_broker  # noqa: E402


def before_tree(rev: str) -> Path:
    from worktree import checkout

    return checkout(rev, REPO / "out" / "chaos" / "before")


def machine() -> dict:
    from soak import machine as soak_machine

    return soak_machine()


def write(out: Path, res: dict) -> None:
    m = res["machine"]
    rows = res["after"] + res.get("before", [])
    network = any(r["scenario"].startswith("net-") for r in rows)
    single = any(not r["scenario"].startswith("net-") for r in rows)
    from tests.toxiproxy import VERSION as TOXIPROXY

    where = " and ".join(
        w for w, on in (("one node, the local broker", single),
                        (f"three nodes, the workers through Toxiproxy {TOXIPROXY}", network))
        if on)
    lines = [
        "# Chaos suite: results",
        "",
        f"`{res['command']}` ({res['date']}); tests/chaos.py says what each scenario does and "
        "checks. A row passes when no id is lost, none is duplicated under exactly_once, every "
        "score is that of the model its output names, no dead letter was written and the "
        "group's committed offsets reached the input's end. *Worker exits* are exits the run "
        "did not ask for (a fenced zombie exits 1 and is started again).",
        "",
        f"Machine: {m.get('Model name', '?')}, {m.get('cpus_usable', '?')} usable CPUs, "
        f"{m.get('ram_gib', 0):.0f} GiB; Python {m['python']}, confluent-kafka "
        f"{m.get('confluent_kafka', '?')} (librdkafka {m.get('librdkafka', '?')}), Apache Kafka "
        f"{m.get('kafka', '?')} ({where}).",
        "",
    ]
    if res.get("before"):
        lines += [f"## Before the fix (workers of {res['before_rev']})", "",
                  chaos.table(res["before"]), ""]
    lines += [f"## After (workers of {res.get('after_rev', '?')})", "",
              chaos.table(res["after"]), ""]
    failed = [r for r in res["after"] if not r["passed"]]
    lines.append("Every row passed." if not failed else
                 "Failed: " + ", ".join(f"{r['scenario']} ({r['mode']})" for r in failed) + ".")
    out.write_text("\n".join(lines) + "\n")
    rows = {k: [{x: v for x, v in r.items() if x != "events"} for r in res[k]]
            for k in ("before", "after") if res.get(k)}
    out.with_suffix(".json").write_text(json.dumps({**res, **rows}, indent=1, default=str)
                                        + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--scenario", action="append", choices=list(chaos.BY_NAME))
    ap.add_argument("--mode", action="append", choices=chaos.MODES)
    ap.add_argument("--before", help="a commit whose workers run `pause` first")
    ap.add_argument("--before-pauses", type=int, default=10,
                    help="pauses in each mode of the run before the fix (it only has to show "
                         "the loss)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "CHAOS-RESULTS.md")
    args = ap.parse_args()
    command = " ".join([".venv/bin/python", "bench/chaos.py", *map(shlex.quote, sys.argv[1:])])
    bootstrap, started = start_local_broker()
    res = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "seed": args.seed, "machine": machine(), "before_rev": args.before,
           "after_rev": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                       capture_output=True, text=True).stdout.strip()}
    try:
        if args.before:
            res["before"] = chaos.play_all(bootstrap, args.seed, ["pause"], args.mode,
                                           long=True, tree=before_tree(args.before),
                                           cycles=args.before_pauses)
        res["after"] = chaos.play_all(bootstrap, args.seed, args.scenario, args.mode,
                                      long=True)
    finally:
        if started:
            subprocess.run([str(BROKER_SCRIPT), "stop"], capture_output=True, timeout=180)
    write(args.out, res)
    print(chaos.table(res["after"]))
    return 0 if all(r["passed"] for r in res["after"]) else 1


if __name__ == "__main__":
    sys.exit(main())
