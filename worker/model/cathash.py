"""CatBoost's categorical values, hashed as CatBoost hashes them.

CatBoost keeps no category strings in a model: a one-hot split names the hash of its category,
CityHash64 (version 1.0.2, the one CatBoost vendors) of the value's UTF-8 string, low 32 bits;
an integer value is hashed as its decimal string. A compiled CatBoost model stores, per
categorical feature, the hashes its splits name (``meta.category_hashes``), and a value's
category code is its hash's position in that list: a value whose hash is not there (an unseen
category, a missing value) has no code and takes the side CatBoost gives it, the false side of
every one-hot split. A boolean is the integer 1 or 0, as CatBoost reads it. The hash is PyPI's
``clickhouse-cityhash`` (ClickHouse's binding of the same CityHash release: checked against
CatBoost's own hashes in tests/test_catboost_categorical.py); Google's later CityHash releases
hash differently.
"""

from __future__ import annotations

import contextlib

import numpy as np

MAX_HASHES = 1024  # codes a feature may have (CatBoost's one_hot_max_size is at most 255)


def _cityhash():
    try:
        from clickhouse_cityhash.cityhash import CityHash64
    except ImportError:
        raise ImportError("this CatBoost model has categorical features, hashed as CatBoost "
                          "hashes them: pip install clickhouse-cityhash (or the package's "
                          "'catboost' extra)") from None
    return CityHash64


def catboost_hash(value: str) -> int:
    """CatBoost's hash of a categorical value (its string)."""
    return int(_cityhash()(value.encode("utf-8", "surrogatepass")) & 0xFFFFFFFF)


class CatBoostHashes:
    """One feature's codes: the hashes its splits name, in code order."""

    def __init__(self, hashes):
        self._code = {int(h): float(i) for i, h in enumerate(hashes)}
        self._hash = _cityhash()

    def _of(self, s: str) -> float:
        h = self._hash(s.encode("utf-8", "surrogatepass")) & 0xFFFFFFFF
        return self._code.get(h, np.nan)

    def codes_of_strings(self, values) -> np.ndarray:
        """float32 codes of strings (None: missing), NaN where a hash is not a split's."""
        return np.asarray([np.nan if v is None else self._of(v) for v in values],
                          dtype=np.float32)

    def codes_of_numbers(self, values: np.ndarray) -> np.ndarray:
        """float32 codes of numbers: a whole number hashed as its decimal string (CatBoost's
        integer categories); NaN, infinities, fractions and floats beyond int64 have no code.
        Each distinct value is hashed once."""
        v = np.asarray(values)
        if v.dtype.kind == "b":  # CatBoost hashes True and False as 1 and 0
            v = v.astype(np.int64)
        if v.dtype.kind in "iu":
            uniq, inverse = np.unique(v, return_inverse=True)
            codes = np.asarray([self._of(str(int(u))) for u in uniq], dtype=np.float32)
            return codes[inverse].reshape(v.shape)
        v = v.astype(np.float64)
        out = np.full(v.shape, np.nan, dtype=np.float32)
        # beyond int64 no category (as the JSON and Avro readers: json_rows.h whole_text)
        whole = np.isfinite(v) & (np.floor(v) == v) & (np.abs(v) < 2.0**63)
        if whole.any():
            uniq, inverse = np.unique(v[whole], return_inverse=True)
            codes = np.asarray([self._of(str(int(u))) for u in uniq], dtype=np.float32)
            out[whole] = codes[inverse]
        return out

    def codes_of_objects(self, values) -> np.ndarray:
        """float32 codes of a mix (a numpy object column, a pandas column): strings hashed,
        numbers as ``codes_of_numbers``, None missing."""
        out = np.full(len(values), np.nan, dtype=np.float32)
        for i, v in enumerate(values):
            if isinstance(v, str):
                out[i] = self._of(v)
            elif isinstance(v, bytes):
                out[i] = self._of(v.decode("utf-8", "replace"))
            elif isinstance(v, (bool, np.bool_)):
                out[i] = self._of(str(int(v)))
            elif v is not None:
                with contextlib.suppress(TypeError, ValueError):
                    out[i] = self.codes_of_numbers(np.asarray([v]))[0]
        return out
