"""python -m tests.fuzz {messages,json,avro,requests,artifacts} --cases N [--seed S] [--state DIR]

Runs N hostile cases through the worker in child processes and prints how they ended; exits 1
on any crash, hang or broken invariant (the cases are kept under DIR). ``child`` is the child
process's own entry point.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def child(kind: str, cases: int, seed: int, state: Path) -> int:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from .runner import Case

    case = Case(state)
    if kind == "messages":
        from .messages import cases as strategy
        from .messages import check_factory
    elif kind == "json":
        from .json_events import cases as strategy
        from .json_events import check_factory
    elif kind == "avro":
        from .avro_events import cases as strategy
        from .avro_events import check_factory
    elif kind == "requests":
        from .serve_requests import cases as strategy
        from .serve_requests import check_factory
    else:
        from .artifacts import cases as strategy
        from .artifacts import check_factory
    check = check_factory(state)

    @hseed(seed)
    @settings(max_examples=cases, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy())
    def body(c):
        data, what = c
        case.begin(data, what)
        case.end(check(data, what, case.n))

    try:
        body()
    finally:
        case.finish()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz")
    ap.add_argument("what", nargs="+",
                    help="messages | json | avro | requests | artifacts | child KIND")
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state", type=Path, default=Path("out/fuzz"))
    args = ap.parse_args(argv)
    if args.what[0] == "child":
        return child(args.what[1], args.cases, args.seed, args.state)
    from .runner import run

    ok = True
    for kind in args.what:
        rep = run(kind, args.cases, args.state / kind, seed=args.seed)
        print(rep.summary(), flush=True)
        ok &= rep.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
