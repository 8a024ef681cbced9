"""The differential matrix's quick half (issue 49; `make fidelity` runs the broad one): every
library's models against the library's own predict on hostile rows, each either exact within
its README promise or refused naming the cause and the way out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
fidelity = pytest.importorskip("fidelity")
pytest.importorskip("catboost")
pytest.importorskip("skl2onnx")
pytest.importorskip("onnxmltools")

REFUSED = {  # configuration -> what its refusal must say (cause and way out)
    "missing=-999": ("reads -999 as missing", "as null"),
    "scale 0.3, bias 0.1": ("scale 0.3", "scale 1"),
    "skl2onnx RF, double input, scikit-learn's double thresholds (ml opset 3)": (
        "between two float32 values", "--float32-inputs"),
}


@pytest.mark.parametrize("library,name,build", fidelity.QUICK, ids=[c[1] for c in fidelity.QUICK])
def test_each_configuration_is_exact_or_refused_by_name(library, name, build):
    row = fidelity.run_one(library, name, build)
    if name in REFUSED:
        assert row["verdict"].startswith("refused"), row
        for phrase in REFUSED[name]:
            assert phrase in row["verdict"], row["verdict"]
        return
    assert not row["verdict"].startswith(("refused", "DIFFERS")), row
    assert row["rows"] >= 3000


def test_the_ulp_measure_sees_one_ulp_at_the_outputs_scale():
    import numpy as np

    a = np.array([0.5, 1.0, 2.0])
    assert fidelity.ulps(a, a) == 0
    assert fidelity.ulps(np.array([0.5, 1.0, np.nextafter(2.0, 3.0)]), a) == 1
    assert fidelity.ulps(np.array([0.5, 1.0, np.nan]), a) == 1 << 62
    f = np.array([0.25, 1.0], np.float32)
    assert fidelity.ulps(np.array([0.25, np.nextafter(np.float32(1), np.float32(2))],
                                  np.float32), f) == 1
