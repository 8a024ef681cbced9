# distutils: language = c++
"""JSON events into row-major float32 rows (json_rows.h: simdjson's DOM parser, a plan of
key paths). ``JsonReader.read`` takes one message's bytes and gives its rows and ids, or the
reason it is not an event or an array of events; it makes no Python object per field."""

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libc.string cimport memcpy
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

import numpy as np


cdef extern from "json_rows.h" namespace "swjson" nogil:
    cdef cppclass Plan:
        Plan() except +
        int n_features
        vector[unordered_map[string, float]] categories
        vector[uint8_t] categorical
        size_t max_rows
        size_t max_bytes
        cbool has_id
        cbool add(const vector[string]& keys, int slot, const string& dotted) except +

    cdef cppclass Out:
        vector[float] rows
        vector[int64_t] id_int
        vector[int8_t] id_kind
        vector[int32_t] id_offsets
        string id_bytes
        size_t n_rows
        cbool single
        const char* code
        string detail

    cdef cppclass Reader:
        Reader(size_t max_depth) except +
        int read(const Plan& plan, const char* data, size_t length, Out& out) except +


ID_NULL, ID_INT, ID_STR = 0, 1, 2


cdef class JsonReader:
    """A reader for one model's features: ``paths`` is each feature's path of keys (a list:
    ``[name]`` unless source.fields says otherwise), ``id_path`` the id's (None: no id),
    ``categories`` each categorical feature's category strings in code order. One read at a
    time: the rows and the parser are the reader's (a second thread is refused)."""

    cdef Plan plan
    cdef Reader* reader
    cdef Out out
    cdef readonly int n_features
    cdef bint busy

    def __cinit__(self, list paths, id_path, dict categories, list feature_names,
                  size_t max_rows, size_t max_bytes, size_t max_depth=64):
        cdef vector[string] keys
        cdef int j
        self.reader = new Reader(max_depth)
        self.n_features = len(paths)
        self.plan.n_features = self.n_features
        self.plan.max_rows = max_rows
        self.plan.max_bytes = max_bytes
        self.plan.categories.resize(self.n_features)
        self.plan.categorical.assign(self.n_features, 0)
        for j, path in enumerate(paths):
            self._add(path, j)
            cats = categories.get(feature_names[j])
            if cats:
                self.plan.categorical[j] = 1
                for code in range(len(cats) - 1, -1, -1):  # the first of equal strings wins
                    self.plan.categories[j][str(cats[code]).encode()] = <float>code
        if id_path is not None:
            self._add(id_path, -2)

    cdef _add(self, list path, int slot):
        cdef vector[string] keys
        if not path:
            raise ValueError("an empty path of keys")
        for key in path:
            keys.push_back(str(key).encode())
        dotted = ".".join(map(str, path))
        if not self.plan.add(keys, slot, dotted.encode()):
            raise ValueError(f"{dotted!r} is read twice, or another field's path goes "
                             "through it")

    def __dealloc__(self):
        del self.reader

    def read(self, const unsigned char[::1] value):
        """(rows (n, features) float32, id kinds (n,) int8 or None without an id, integer
        ids (n,) int64, string id offsets (n + 1,) int32, string id bytes, single); or (code,
        detail) for a message that is not one."""
        cdef size_t n = value.shape[0]
        cdef const char* data = <const char*>&value[0] if n else <const char*>b""
        cdef int rc
        if self.busy:  # checked and set holding the GIL
            raise RuntimeError("JsonReader.read is not reentrant: one reader a thread")
        self.busy = True
        try:
            with nogil:
                rc = self.reader.read(self.plan, data, n, self.out)
        finally:
            self.busy = False
        if rc:
            return (self.out.code.decode(), self.out.detail.decode("utf-8", "replace"))
        cdef size_t rows = self.out.n_rows
        X = np.empty((rows, self.n_features), dtype=np.float32)
        cdef float[:, ::1] xv = X
        if rows and self.n_features:
            memcpy(&xv[0, 0], self.out.rows.data(), rows * self.n_features * sizeof(float))
        if not self.plan.has_id:
            return (X, None, None, None, None, self.out.single)
        kinds = np.empty(rows, dtype=np.int8)
        ints = np.empty(rows, dtype=np.int64)
        offsets = np.empty(rows + 1, dtype=np.int32)
        cdef int8_t[::1] kv = kinds
        cdef int64_t[::1] iv = ints
        cdef int32_t[::1] ov = offsets
        if rows:
            memcpy(&kv[0], self.out.id_kind.data(), rows)
            memcpy(&iv[0], self.out.id_int.data(), rows * sizeof(int64_t))
        memcpy(&ov[0], self.out.id_offsets.data(), (rows + 1) * sizeof(int32_t))
        return (X, kinds, ints, offsets, bytes(self.out.id_bytes), self.out.single)
