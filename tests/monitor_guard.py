"""Run by tests/test_monitoring.py in a child process: row blocks whose data ends exactly at
an inaccessible page, counted; a read past an array's end is a SIGSEGV here (the child's
exit code), not silently harmless. Prints the shapes counted."""

import ctypes
import mmap
import sys

import numpy as np

from worker import _monitor

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_keep = []


def guarded(n: int, nf: int) -> np.ndarray:
    """A float32 (n, nf) array whose last byte is the last before a PROT_NONE page."""
    nbytes = n * nf * 4
    body = max((nbytes + PAGE - 1) // PAGE * PAGE, PAGE)
    mm = mmap.mmap(-1, body + PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    assert libc.mprotect(base + body, PAGE, 0) == 0
    a = np.frombuffer(mm, dtype=np.float32, count=n * nf, offset=body - nbytes)
    _keep.append(mm)
    return a.reshape(n, nf)


def main() -> int:
    rng = np.random.default_rng(0)
    done = 0
    for nf in (1, 3, 5, 7, 9, 10, 15, 17, 20, 30, 31, 33):
        edges = np.sort(rng.normal(size=(nf, 9)).astype(np.float32), axis=1)
        plan = _monitor.Plan(edges, np.full(nf, 9, np.int32), np.full(nf, -2, np.float32),
                             np.full(nf, 2, np.float32), np.zeros(0), 13)
        splan = _monitor.Plan(edges, np.full(nf, 9, np.int32), np.full(nf, -2, np.float32),
                              np.full(nf, 2, np.float32), np.array([0.0, 0.5, 1.0]), 13)
        for n in (1, 2, 3, 5, 17, 255, 256, 257):
            X = guarded(n, nf)
            X[...] = rng.normal(size=(n, nf))
            counts = np.zeros((nf, 13), np.int64)
            plan.count(X, counts)
            want = np.stack([np.bincount(np.searchsorted(edges[j], X[:, j], side="right"),
                                         minlength=10) for j in range(nf)])
            assert (counts[:, :10] == want).all(), (n, nf)
            done += 1
            assert (_monitor.missing_counts(X) == np.isnan(X).sum(axis=0)).all(), (n, nf)
            # scores whose last byte is a page's last, binned 8 at a time
            sc = np.frombuffer(guarded(2, n).data, np.float64, count=n)
            sc[...] = rng.choice(np.array([np.nan, np.inf, -1, 0, 0.5, 1, 2]), n)
            bins = np.zeros(4, np.int64)
            splan.count(X, counts, sc, bins)
            assert (bins == np.bincount(np.searchsorted([0.0, 0.5, 1.0], sc, side="right"),
                                        minlength=4)).all(), (n, nf)
            if n <= 5:  # a Counter keeps a few rows (copied from where they lie) to count later
                c = _monitor.Counter(plan)
                c.add(X, np.zeros(n))
                assert (c.counts[:, :10] == want).all(), (n, nf)
                done += 1
    print(f"counted {done} guarded blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
