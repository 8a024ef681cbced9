"""The compiled-model file: data only, versioned, checksummed. Loading never executes code.

Layout: ``MAGIC`` | u32 format version | u64 header length | UTF-8 JSON header | array bytes
(each 64-byte aligned) | 32-byte SHA-256 of everything before it. The SHA-256 is the model id.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np

MAGIC = b"SWMODEL\x00"
FORMAT_VERSION = 2  # 2: node keys are 2 * feature + missing-goes-right
_ALLOWED = {"<u4", "<i4", "<i8", "<f4", "<f8", "|u1"}


class ArtifactError(ValueError):
    """The file is not a valid compiled model (wrong type, truncated, corrupted, newer format)."""


def dumps(meta: dict, arrays: dict[str, np.ndarray]) -> bytes:
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
    header = json.dumps({"meta": meta, "arrays": specs}, sort_keys=True).encode()
    body = MAGIC + struct.pack("<IQ", FORMAT_VERSION, len(header)) + header + b"".join(chunks)
    return body + hashlib.sha256(body).digest()


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
    header = json.loads(body[start:start + hlen])
    arrays, base = {}, start + hlen
    for spec in header["arrays"]:
        if spec["dtype"] not in _ALLOWED:
            raise ArtifactError(f"{what}: array {spec['name']!r} has unsupported dtype")
        lo = base + spec["offset"]
        buf = body[lo:lo + spec["nbytes"]]
        arr = np.frombuffer(buf, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"])
        arrays[spec["name"]] = arr
    return header["meta"], arrays, digest.hex()


def save(path: str | Path, meta: dict, arrays: dict[str, np.ndarray]) -> str:
    data = dumps(meta, arrays)
    Path(path).write_bytes(data)
    return data[-32:].hex()


def load(path: str | Path) -> tuple[dict, dict[str, np.ndarray], str]:
    return loads(Path(path).read_bytes(), what=str(path))
