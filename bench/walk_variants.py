"""Model B's padded nodes and 512 doubled rows for bench/walk_variants.c, compiled and run:
the step and chain variants of the padded SPLIT walk tried for issue 56 (bench/NOTES.md).

    python bench/walk_variants.py          # one thread: run it under taskset -c 0
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, ".")
import worker  # noqa: E402
from worker import _kernels  # noqa: E402

sys.path.insert(0, "bench")
import models as M  # noqa: E402
import numpy as np  # noqa: E402


def main() -> int:
    model = worker.compile_model(M.load("B").source, kernel="walk")
    assert int(model.depth) == 8
    q = np.asarray(_kernels.order_key_nodes(model.arrays["pnodes"]), dtype=np.uint32)
    X = M.data(512, seed=7)[0].astype(np.float32)
    xx = np.stack([np.asarray(_kernels.split_row_keys(np.ascontiguousarray(r)), dtype=np.uint32)
                   for r in X])
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "walk_variants")
        subprocess.run(["gcc", "-O3", "-I", os.path.join(here, "..", "cyext"),
                        os.path.join(here, "walk_variants.c"), "-o", exe], check=True)
        q.tofile(os.path.join(d, "nodes.bin"))
        xx.astype(np.uint32).tofile(os.path.join(d, "xx.bin"))
        return subprocess.run([exe, os.path.join(d, "nodes.bin"),
                               os.path.join(d, "xx.bin")]).returncode


if __name__ == "__main__":
    sys.exit(main())
