"""Try mutants by hand against a test, in the edit loop: does the test written for a
survivor fail with it (killed) and pass without it?

    python mutation/check.py cases.json

``cases.json`` is a list of objects: ``file`` (the module, from the checkout's root),
``old`` (its text, found exactly once, or the ``nth`` time it occurs, from 0), ``new`` (the
mutant's text), ``tests`` (test files) and ``k`` (a pytest -k expression, "" for all). Each
mutant is written into a copy of the checkout (out/mutation/tree/check, refreshed at each
run as run.py refreshes its own: never the files being edited), the tests run there, and the
original is put back: KILLED (a test failed) or SURVIVED, with pytest's last line.
mutation/run.py finds the survivors; this shows the test written for one kills it (as
``run.py --rerun-survivors`` would, without running the module's whole test list)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import _copy_tree  # noqa: E402 (the checkout's copy, as run.py makes it)


def _apply(text: str, old: str, new: str, nth: int | None) -> str:
    if nth is None:
        if text.count(old) != 1:
            raise SystemExit(f"found {text.count(old)} times (give nth): {old!r}")
        return text.replace(old, new)
    at = -1
    for _ in range(nth + 1):
        at = text.index(old, at + 1)
    return text[:at] + new + text[at + len(old):]


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    cases = json.loads(Path(sys.argv[1]).read_text())
    tree = _copy_tree("check")
    survived = 0
    for c in cases:
        f = tree / c["file"]
        original = f.read_text()
        f.write_text(_apply(original, c["old"], c["new"], c.get("nth")))
        try:
            r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                                "no:cacheprovider", "-p", "no:randomly", *c["tests"],
                                "-k", c.get("k", "")], cwd=tree, capture_output=True,
                               text=True)
        finally:
            f.write_text(original)
        last = (r.stdout.strip().splitlines() or [r.stderr.strip()[-200:]])[-1]
        killed = r.returncode != 0
        survived += not killed
        print("KILLED  " if killed else "SURVIVED", c["new"].strip().splitlines()[0][:80],
              "|", last)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
