"""The compiled-model file: data only, versioned, checksummed. Loading never executes code.

Layout: ``MAGIC`` | u32 format version | u64 header length | UTF-8 JSON header | array bytes
(each 64-byte aligned) | 32-byte SHA-256 of everything before it. The SHA-256 is the model id,
except that the compile's measurements (``meta.layout_choice``: the candidates' timings on the
machine that compiled it) and the reference profile (``meta.reference``) are left out of the id:
the id is the trailer the same artifact would have without them, so one model compiled twice to
the same layout keeps its id, with or without a profile.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import numpy as np

MAGIC = b"SWMODEL\x00"
FORMAT_VERSION = 2  # 2: node keys are 2 * feature + missing-goes-right
_ALLOWED = {"<u4", "<i4", "<i8", "<f4", "<f8", "|u1"}


class ArtifactError(ValueError):
    """The file is not a valid compiled model (wrong type, truncated, corrupted, newer format)."""


def format_version(path: str | Path) -> int | None:
    """The format version a file says it has (None: not an artifact), read from its first
    bytes only: to tell a stale artifact from a current one without loading it."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 4)
    if len(head) < len(MAGIC) + 4 or not head.startswith(MAGIC):
        return None
    return struct.unpack_from("<I", head, len(MAGIC))[0]


MEASURED = "layout_choice"  # meta key outside the model id (see the module docstring)
# meta keys outside the model id: the compile's measurements, and the reference profile
# flight monitoring compares against (model/reference.py): neither changes what is computed
OUTSIDE_ID = (MEASURED, "reference")


def _head(meta: dict, specs: list) -> bytes:
    header = json.dumps({"meta": meta, "arrays": specs}, sort_keys=True).encode()
    return MAGIC + struct.pack("<IQ", FORMAT_VERSION, len(header)) + header


def _model_id(meta: dict, specs: list, data, digest: bytes) -> str:
    """The trailer digest, or for an artifact with measurements the digest it would have
    without them."""
    if not any(k in meta for k in OUTSIDE_ID):
        return digest.hex()
    h = hashlib.sha256(_head({k: v for k, v in meta.items() if k not in OUTSIDE_ID}, specs))
    h.update(data)
    return h.hexdigest()


def dumps(meta: dict, arrays: dict[str, np.ndarray]) -> bytes:
    return dumps_with_id(meta, arrays)[0]


def dumps_with_id(meta: dict, arrays: dict[str, np.ndarray]) -> tuple[bytes, str]:
    """The artifact's bytes and its model id."""
    specs, chunks, offset = [], [], 0
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        a = a.astype(dt, copy=False)
        if dt.str not in _ALLOWED:
            raise TypeError(f"array {name!r} has dtype {dt.str}, not storable")
        pad = (-offset) % 64
        chunks.append(b"\x00" * pad)
        offset += pad
        specs.append({"name": name, "dtype": dt.str, "shape": list(a.shape), "offset": offset,
                      "nbytes": a.nbytes})
        chunks.append(a.tobytes())
        offset += a.nbytes
    data = b"".join(chunks)
    body = _head(meta, specs) + data
    digest = hashlib.sha256(body).digest()
    return body + digest, _model_id(meta, specs, data, digest)


def loads(data: bytes, what: str = "model") -> tuple[dict, dict[str, np.ndarray], str]:
    """Return (meta, arrays, model_id); every failure is an ArtifactError saying what is wrong."""
    if len(data) < len(MAGIC) + 12 + 32 or not data.startswith(MAGIC):
        if data.startswith(MAGIC):
            raise ArtifactError(f"{what}: truncated compiled model ({len(data)} bytes)")
        raise ArtifactError(f"{what}: not a scoring-worker compiled model (bad magic); "
                            "compile it with `scoring-worker compile`")
    version, hlen = struct.unpack_from("<IQ", data, len(MAGIC))
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{what}: artifact format {version}, this build reads "
                            f"{FORMAT_VERSION}; recompile the model")
    body, digest = data[:-32], data[-32:]
    start = len(MAGIC) + 12
    if start + hlen > len(body):
        raise ArtifactError(f"{what}: truncated compiled model (header cut off)")
    if hashlib.sha256(body).digest() != digest:
        raise ArtifactError(f"{what}: checksum mismatch: the compiled model is truncated or "
                            "corrupted")
    try:
        header = json.loads(body[start:start + hlen])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{what}: header is not valid JSON: {exc}") from None
    except RecursionError:
        raise ArtifactError(f"{what}: header is nested too deep") from None
    if not isinstance(header, dict) or not isinstance(header.get("meta"), dict) \
            or not isinstance(header.get("arrays"), list):
        raise ArtifactError(f"{what}: header lacks its 'meta' mapping or 'arrays' list")
    arrays, base = {}, start + hlen
    section = _aligned(memoryview(body)[base:])
    for spec in header["arrays"]:
        name, arr = _array(spec, section, 0, what)
        if name in arrays:
            raise ArtifactError(f"{what}: array {name!r} stored twice")
        arrays[name] = arr
    try:
        model_id = _model_id(header["meta"], header["arrays"], memoryview(body)[base:], digest)
    except RecursionError:  # json.loads took a depth json.dumps cannot write back
        raise ArtifactError(f"{what}: header is nested too deep") from None
    return header["meta"], arrays, model_id


def _aligned(section: memoryview) -> np.ndarray:
    """The arrays' section copied once to a 64-byte boundary, read-only: their offsets are
    64-aligned from its start, but a bytes object's data starts wherever Python put it, so
    views of it gave arrays off their own element size (undefined behaviour for the kernels'
    loads, UBSan: misaligned)."""
    buf = np.empty(len(section) + 64, dtype=np.uint8)
    lo = (-buf.ctypes.data) % 64
    out = buf[lo:lo + len(section)]
    out[:] = np.frombuffer(section, dtype=np.uint8)
    buf.flags.writeable = False  # the owner too: a view's flag could be set back otherwise
    out.flags.writeable = False
    return out


def _array(spec, body, base: int, what: str) -> tuple[str, np.ndarray]:
    """One array spec of the header, checked against the body before numpy sees it."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ArtifactError(f"{what}: an array spec without a name")
    name = spec["name"]
    if not isinstance(spec.get("dtype"), str) or spec["dtype"] not in _ALLOWED:
        raise ArtifactError(f"{what}: array {name!r} has unsupported dtype {spec.get('dtype')!r}")
    shape, offset, nbytes = spec.get("shape"), spec.get("offset"), spec.get("nbytes")
    ints = [offset, nbytes] + (shape if isinstance(shape, list) else [None])
    if not isinstance(shape, list) or not 1 <= len(shape) <= 2 or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in ints):
        raise ArtifactError(f"{what}: array {name!r}: shape, offset and nbytes must be "
                            "non-negative integers (1 or 2 dimensions)")
    itemsize = np.dtype(spec["dtype"]).itemsize
    if math.prod(shape) * itemsize != nbytes:
        raise ArtifactError(f"{what}: array {name!r}: shape {shape} does not hold {nbytes} "
                            "bytes")
    lo = base + offset
    if lo + nbytes > len(body):
        raise ArtifactError(f"{what}: array {name!r} lies outside the file")
    arr = np.frombuffer(body, dtype=np.dtype(spec["dtype"]), count=nbytes // itemsize,
                        offset=lo).reshape(shape)
    return name, arr


def save(path: str | Path, meta: dict, arrays: dict[str, np.ndarray]) -> str:
    """Write atomically: a temporary file beside ``path``, fsynced, then renamed over it, so a
    worker watching ``path`` (model.reload) never sees half an artifact."""
    import os
    import tempfile

    data, model_id = dumps_with_id(meta, arrays)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as a plain write would (mkstemp makes it 0600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return model_id


def load(path: str | Path) -> tuple[dict, dict[str, np.ndarray], str]:
    p = Path(path)
    if p.is_dir():
        raise ArtifactError(f"{p} is a directory, not a compiled model")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ArtifactError(f"{p}: cannot read: {exc.strerror or exc}") from None
    return loads(data, what=str(p))
