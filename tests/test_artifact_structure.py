"""Artifacts whose checksum is right but whose content lies: each is refused at load with an
ArtifactError naming the field, before any kernel reads it (and the CLI exits 2)."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import worker
from worker.model import artifact

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "fraud-xgb.model"


@pytest.fixture(scope="module")
def compact_bytes():
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5))
    rf = RandomForestClassifier(n_estimators=10, max_depth=12, random_state=0).fit(
        X, X[:, 0] > 0)
    return worker.compile_model(rf, layout="compact").to_bytes()


def _edit(data: bytes, fn) -> bytes:
    meta, arrays, _ = artifact.loads(data)
    arrays = {k: v.copy() for k, v in arrays.items()}
    fn(meta, arrays)
    return artifact.dumps(meta, arrays)  # a fresh, correct checksum


def _refused(tmp_path, data: bytes, match: str):
    p = tmp_path / "m.model"
    p.write_bytes(data)
    with pytest.raises(worker.ArtifactError, match=match):
        worker.load_model(p)


def test_root_shorter_than_the_tree_count(tmp_path, compact_bytes):
    data = _edit(compact_bytes, lambda m, a: a.update(root=a["root"][:-1]))
    _refused(tmp_path, data, r"arrays\.root: shape")


def test_compact_leaf_threshold_minus_inf(tmp_path, compact_bytes):
    def lie(m, a):
        leaf = np.flatnonzero(a["cnodes"][:, 0] & 0x80000000)[0]
        a["cnodes"][leaf, 1] = np.float32(-np.inf).view(np.uint32)

    _refused(tmp_path, _edit(compact_bytes, lie), r"arrays\.cnodes: a leaf threshold")


def test_depth_32(tmp_path):
    data = _edit(GOLDEN.read_bytes(), lambda m, a: m.update(depth=32))
    _refused(tmp_path, data, r"meta\.depth")


def test_negative_unit_ptr_entry(tmp_path):
    def lie(m, a):
        a["unit_ptr"][5] = -3

    _refused(tmp_path, _edit(GOLDEN.read_bytes(), lie), r"arrays\.unit_ptr")


def test_feature_index_beyond_n_features(tmp_path):
    def lie(m, a):
        a["pnodes"][0, 0] = 2 * 14

    _refused(tmp_path, _edit(GOLDEN.read_bytes(), lie), r"arrays\.pnodes: a node key")


def test_padded_nan_threshold(tmp_path):
    # the order-key walk reads a negative NaN threshold as "go right", the float walks as
    # "left": no library writes one, so an artifact that does is refused, not scored two ways
    def lie(m, a):
        a["pnodes"][3, 1] = np.uint32(0xFFC00001)

    _refused(tmp_path, _edit(GOLDEN.read_bytes(), lie), r"arrays\.pnodes: a NaN threshold")


@pytest.mark.parametrize("bits", [0xFFC00000, 0x7FC00000, 0x7F800001])
def test_compact_nan_threshold(tmp_path, compact_bytes, bits):
    # as in the padded layout: found by an attacker review, a negative NaN threshold sent
    # every row right in batches of 256 rows or more (the order-key walks) and left in
    # smaller ones (the float walks)
    def lie(m, a):
        inner = np.flatnonzero((a["cnodes"][:, 0] & 0x80000000) == 0)[0]
        a["cnodes"][inner, 1] = np.uint32(bits)

    _refused(tmp_path, _edit(compact_bytes, lie), r"arrays\.cnodes: a NaN threshold")


def test_loaded_arrays_sit_on_64_byte_boundaries(tmp_path, compact_bytes):
    """The arrays' offsets are 64-aligned within the file; loaded, each array is too (a view
    of the file's bytes object sat wherever its data began: UBSan reported the kernels'
    misaligned loads), and read-only, as the views were."""
    for extra in range(3):  # headers of other lengths: the section starts elsewhere
        data = _edit(compact_bytes, lambda m, a, k=extra: m.update(note="x" * k))
        meta, arrays, _ = artifact.loads(data)
        for name, arr in arrays.items():
            assert arr.ctypes.data % 64 == 0, name
            assert not arr.flags.writeable, name
            with pytest.raises(ValueError):  # and cannot be made writeable again
                arr.flags.writeable = True


def test_child_pointing_backwards(tmp_path, compact_bytes):
    def lie(m, a):
        inner = np.flatnonzero((a["cnodes"][:, 0] & 0x80000000) == 0)[1]
        a["cnodes"][inner, 2] = inner - 1

    _refused(tmp_path, _edit(compact_bytes, lie), r"arrays\.cnodes: a child index")


def _reseal(header: bytes, payload: bytes) -> bytes:
    body = artifact.MAGIC + struct.pack("<IQ", artifact.FORMAT_VERSION, len(header)) \
        + header + payload
    return body + hashlib.sha256(body).digest()


def _parts(data: bytes):
    start = len(artifact.MAGIC) + 12
    hlen = struct.unpack_from("<Q", data, len(artifact.MAGIC) + 4)[0]
    return json.loads(data[start:start + hlen]), data[start + hlen:-32]


@pytest.mark.parametrize("edit,match", [
    (lambda h: b"{not json" + h, "header is not valid JSON"),
    (lambda h: json.dumps({"meta": {}}).encode(), "lacks its 'meta' mapping or 'arrays'"),
    (lambda h: h.replace(b'"shape": [60]', b'"shape": [1000000000000]'), "does not hold"),
    (lambda h: h.replace(b'"offset": 64', b'"offset": 99999999999'), "outside the file"),
    (lambda h: h.replace(b'"dtype": "<i8"', b'"dtype": "|O"'), "unsupported dtype"),
])
def test_header_lies(tmp_path, edit, match):
    header, payload = _parts(GOLDEN.read_bytes())
    h = json.dumps(header, sort_keys=True).encode()
    _refused(tmp_path, _reseal(edit(h), payload), match)


@pytest.mark.parametrize("what", ["directory", "lie"])
def test_cli_exits_2_with_one_line(tmp_path, what):
    if what == "directory":
        model = tmp_path / "dir.model"
        model.mkdir()
    else:
        model = tmp_path / "m.model"
        model.write_bytes(_edit(GOLDEN.read_bytes(), lambda m, a: m.update(depth=32)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {model}}}\nsource: {{type: file, path: "
                   f"{ROOT / 'tests/golden/input.arrows'}}}\n"
                   f"sink: {{type: file, path: {tmp_path / 'o.arrows'}}}\n")
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "--config", str(cfg)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "model.path" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "score", "--model", str(model),
                           "--input", str(ROOT / "tests/golden/input.arrows"), "--output",
                           str(tmp_path / "s.arrows")], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def test_leaf_bounds_narrower_than_the_leaves(tmp_path, compact_bytes):
    # certified stopping trusts these bounds: forged to 0 they stopped every row at once and
    # changed decisions (found in review); now the artifact is refused
    def forge(m, a):
        a["leaf_min"][:] = 0.0
        a["leaf_max"][:] = 0.0

    _refused(tmp_path, _edit(GOLDEN.read_bytes(), forge), r"leaf_min/leaf_max")
    _refused(tmp_path, _edit(compact_bytes, forge), r"leaf_min/leaf_max")

    def one_tree(m, a):  # narrower by one leaf of one tree is enough
        a["leaf_max"][3, 0] = np.nextafter(a["leaf_max"][3, 0], -np.inf) - 1e-3

    _refused(tmp_path, _edit(GOLDEN.read_bytes(), one_tree), r"leaf_min/leaf_max")
