"""`serve`'s one-row requests/s alone, for bench/ab.py: the server of the working directory's
tree (the side ab.py runs in), pinned and loaded as bench/serve.py does (wrk 1 thread, 8
connections, one-row JSON on bench/serve.py's model), dense rows and rows with missing values.
Prints ``NAME VALUE`` lines.

    .venv/bin/python bench/ab.py --a HEAD --b . --runs 8 -- .venv/bin/python bench/serve_ab.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve as sb  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5)
    args = ap.parse_args()
    import models

    _, art, _ = sb.model_files()
    X, _ = models.data(2000, seed=7)
    Xm = models.with_missing(X, seed=8, frac=0.2)
    tree = Path.cwd()  # (bench/ab.py runs this in the side's tree)
    port = sb.free_port()
    s = sb.Server("scoring-worker serve", [sys.executable, "-m", "worker.cli", "serve",
                                           "--model", str(art), "--name", "xgb300",
                                           "--port", str(port)], port, "xgb300",
                  env=sb._env(PYTHONPATH=os.pathsep.join([str(tree),
                                                          os.environ.get("PYTHONPATH", "")])),
                  cwd=tree)
    try:
        s.wait_ready()
        for name, row in (("one_row_json_per_s", X[:1]),
                          ("one_row_json_missing_per_s", Xm[:1])):
            r = sb.wrk(s.infer_url, sb.json_body(row), "application/json", args.seconds)
            if r["errors"]:
                raise RuntimeError(f"{name}: {r['errors']} errors")
            print(f"{name} {r['rps']:.1f}")
            print(f"{name.replace('_per_s', '')}_p99_ms {r['percentiles_us']['99'] / 1e3:.3f}")
    finally:
        s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
