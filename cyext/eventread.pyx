# distutils: language = c++
"""Events into row-major float32 rows, no Python object per field: JSON (json_rows.h:
simdjson's DOM parser, a plan of key paths; ``JsonReader``) and Avro records (avro_rows.h: a
reader plan of the writer schema; ``AvroReader``). ``read`` takes one message's bytes and
gives its rows and ids, or the reason it is not one; ``encode_scores`` writes JSON out."""

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
        vector[uint8_t] hashed
        vector[uint8_t] optional
        vector[uint8_t] cast
        vector[string] labels
        size_t max_rows
        size_t max_bytes
        cbool has_id
        cbool id_optional
        string id_label
        cbool add(const vector[string]& keys, int slot, const string& dotted) except +

    cdef cppclass Out:
        vector[float] rows
        vector[int64_t] id_int
        vector[int8_t] id_kind
        vector[int32_t] id_offsets
        string id_bytes
        vector[int64_t] cat_at
        vector[int32_t] cat_ends
        string cat_bytes
        vector[int64_t] absent
        vector[int64_t] unseen
        cbool counted
        size_t n_rows
        cbool single
        const char* code
        string detail
        int fail_slot
        const char* fail_kind
        void release()

    cdef cppclass Reader:
        Reader(size_t max_depth) except +
        int read(const Plan& plan, const char* data, size_t length, Out& out) except +


ID_NULL, ID_INT, ID_STR = 0, 1, 2


cdef _failure(Out& out):
    """(code, detail, the feature's slot or -1, what went wrong with it) of a failed read."""
    return (out.code.decode(), out.detail.decode("utf-8", "replace"), out.fail_slot,
            out.fail_kind.decode() or out.code.decode())


cdef _counts(Out& out):
    """(absent, unseen) per feature slot (int64) of the last read, or None: all zero."""
    if not out.counted:
        return None
    cdef size_t f = out.absent.size()
    absent = np.empty(f, dtype=np.int64)
    unseen = np.empty(f, dtype=np.int64)
    cdef int64_t[::1] av = absent
    cdef int64_t[::1] uv = unseen
    if f:
        memcpy(&av[0], out.absent.data(), f * sizeof(int64_t))
        memcpy(&uv[0], out.unseen.data(), f * sizeof(int64_t))
    return absent, unseen


cdef _cats(Out& out):
    """The hashed categorical values' (where (int64: row * n_features + slot), ends (int32)
    of their texts, the texts' bytes)."""
    cdef size_t k = out.cat_at.size()
    at = np.empty(k, dtype=np.int64)
    ends = np.empty(k, dtype=np.int32)
    cdef int64_t[::1] av = at
    cdef int32_t[::1] ev = ends
    if k:
        memcpy(&av[0], out.cat_at.data(), k * sizeof(int64_t))
        memcpy(&ev[0], out.cat_ends.data(), k * sizeof(int32_t))
    return at, ends, bytes(out.cat_bytes)


cdef _result(Out& out, bint has_id, bint hashed=False):
    """(rows (n, features) float32, id kinds (n,) int8 or None without an id, integer ids
    (n,) int64, string id offsets (n + 1,) int32, string id bytes, single), and with
    ``hashed`` the hashed categorical values (``_cats``) last."""
    if hashed:
        return _result(out, has_id) + (_cats(out),)
    cdef size_t rows = out.n_rows
    cdef size_t nf = out.rows.size() // rows if rows else 0
    X = np.empty((rows, nf), dtype=np.float32)
    cdef float[:, ::1] xv = X
    if rows and nf:
        memcpy(&xv[0, 0], out.rows.data(), rows * nf * sizeof(float))
    if not has_id:
        return (X, None, None, None, None, out.single)
    kinds = np.empty(rows, dtype=np.int8)
    ints = np.empty(rows, dtype=np.int64)
    offsets = np.empty(rows + 1, dtype=np.int32)
    cdef int8_t[::1] kv = kinds
    cdef int64_t[::1] iv = ints
    cdef int32_t[::1] ov = offsets
    if rows:
        memcpy(&kv[0], out.id_kind.data(), rows)
        memcpy(&iv[0], out.id_int.data(), rows * sizeof(int64_t))
    memcpy(&ov[0], out.id_offsets.data(), (rows + 1) * sizeof(int32_t))
    return (X, kinds, ints, offsets, bytes(out.id_bytes), out.single)




cdef class JsonReader:
    """A reader for one model's features: ``paths`` is each feature's path of keys (a list:
    ``[name]`` unless source.fields says otherwise), ``id_path`` the id's (None: no id),
    ``categories`` each categorical feature's category strings in code order; ``hashed`` the
    features whose strings the caller reads (CatBoost's hashed categories: NaN here);
    ``optional`` the features an event may leave out, ``casts`` each feature's cast code
    (formats/base.py CAST_CODES). One read at a time: the rows and the parser are the
    reader's (a second thread is refused)."""

    cdef Plan plan
    cdef Reader* reader
    cdef Out out
    cdef readonly int n_features
    cdef bint busy
    cdef bint any_hashed

    def __cinit__(self, list paths, id_path, dict categories, list feature_names,
                  size_t max_rows, size_t max_bytes, size_t max_depth=64, hashed=(),
                  optional=(), casts=None, id_optional=False, id_name=None):
        cdef vector[string] keys
        cdef int j
        if not 1 <= max_depth <= 1024:  # simdjson's nesting bound (its buffers: a slot each)
            raise ValueError("max_depth must be from 1 to 1024")
        if len(feature_names) != len(paths) or (casts is not None and
                                                 len(casts) != len(paths)):
            raise ValueError("paths, feature names and casts differ in number")
        self.reader = new Reader(max_depth)
        self.n_features = len(paths)
        self.plan.n_features = self.n_features
        self.plan.max_rows = max_rows
        self.plan.max_bytes = max_bytes
        self.plan.categories.resize(self.n_features)
        self.plan.categorical.assign(self.n_features, 0)
        self.plan.hashed.assign(self.n_features, 0)
        self.plan.optional.assign(self.n_features, 0)
        self.plan.cast.assign(self.n_features, 0)
        for j, path in enumerate(paths):
            self._add(path, j)
            self.plan.labels.push_back(
                f"feature {feature_names[j]!r} ({'.'.join(map(str, path))})".encode())
            if feature_names[j] in optional:
                self.plan.optional[j] = 1
            if casts is not None:
                if not (0 <= casts[j] <= 2):
                    raise ValueError("a cast code outside 0..2")
                self.plan.cast[j] = casts[j]
            cats = categories.get(feature_names[j])
            if cats:
                self.plan.categorical[j] = 1
                for code in range(len(cats) - 1, -1, -1):  # the first of equal strings wins
                    self.plan.categories[j][str(cats[code]).encode()] = <float>code
            elif feature_names[j] in hashed:
                # CatBoost's hashed categories: each value's text for the caller to hash
                # (formats/json.py), the row's value NaN
                self.plan.hashed[j] = 1
                self.any_hashed = True
        if id_path is not None:
            self._add(id_path, -2)
            self.plan.id_optional = bool(id_optional)
            self.plan.id_label = (f"the id {id_name or id_path[-1]!r} "
                                  f"({'.'.join(map(str, id_path))})").encode()

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
        ids (n,) int64, string id offsets (n + 1,) int32, string id bytes, single); or
        ``_failure``'s (code, detail, slot, kind) for a message that is not one."""
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
        try:
            if rc:
                return _failure(self.out)
            return _result(self.out, self.plan.has_id, self.any_hashed)
        finally:
            self.out.release()  # a large message's buffers (the counts stay)

    def counts(self):
        """The last read's (absent, unseen) per feature (int64 arrays), or None: none."""
        return _counts(self.out)


cdef extern from "avro_rows.h" namespace "swavro" nogil:
    cdef cppclass ANode "swavro::Node":
        int32_t kind
        int32_t slot
        int64_t a
        int64_t b

    cdef cppclass APlan "swavro::Plan":
        APlan() except +
        vector[ANode] nodes
        vector[int32_t] children
        vector[float] enum_codes
        vector[string] symbols
        vector[unordered_map[string, float]] tables
        vector[uint8_t] hashed
        vector[int32_t] covers
        vector[uint8_t] optional
        vector[string] labels
        int n_features
        size_t max_bytes

    cdef cppclass AReader "swavro::Reader":
        AReader() except +
        int read(const APlan& plan, const unsigned char* data, size_t length, Out& out) \
            except +


cdef class AvroReader:
    """A reader plan of one writer schema (worker/formats/avro.py compiles it): ``nodes``
    (kind, slot, a, b) rows, ``children`` (record fields and union branches in order),
    ``enum_codes`` (an enum symbol's category code), ``tables`` (a string feature's
    categories: string -> code), ``covers`` (the slots a null node stands for), ``labels``
    (each feature's name and path, for details) and ``optional`` (features a record may
    leave out). Checked here before the C++ reader may follow it: every index in range,
    children after their parent (no cycle), each node one parent (a tree, no shared
    subtree), at most 40 deep, slots inside the features."""

    cdef APlan plan
    cdef AReader reader
    cdef Out out
    cdef bint has_id
    cdef bint busy
    cdef bint any_hashed

    def __cinit__(self, list nodes, list children, list enum_codes, list tables,
                  int n_features, size_t max_bytes, list symbols=None, hashed=(),
                  list covers=None, list labels=None, optional=()):
        cdef ANode node
        cdef Py_ssize_t i, n = len(nodes)
        if n == 0 or n_features < 0:
            raise ValueError("an empty plan, or a negative feature count")
        covers = covers or []
        labels = labels if labels is not None else [f"feature {j}" for j in range(n_features)]
        if len(labels) != n_features:
            raise ValueError("a label a feature")
        self.plan.n_features = n_features
        self.plan.max_bytes = max_bytes
        for label in labels:
            self.plan.labels.push_back(str(label).encode())
        self.plan.optional.assign(n_features, 0)
        for j in optional:
            if not (0 <= j < n_features):
                raise ValueError("an optional feature outside the features")
            self.plan.optional[j] = 1
        for c in covers:
            if not (0 <= c < n_features):
                raise ValueError("a covered slot outside the features")
            self.plan.covers.push_back(c)
        # hashed slots (CatBoost's categories): their values' texts, enums by symbol
        self.plan.hashed.assign(max(n_features, 0), 0)
        for j in hashed:
            if not (0 <= j < n_features):
                raise ValueError("a hashed feature outside the features")
            self.plan.hashed[j] = 1
            self.any_hashed = True
        if symbols is None:
            if self.any_hashed:  # a hashed enum's text is its symbol: never made up
                raise ValueError("hashed features need the enum symbols")
            symbols = [""] * len(enum_codes)
        if len(symbols) != len(enum_codes):
            raise ValueError("enum symbols and codes differ in number")
        for sym in symbols:
            self.plan.symbols.push_back(str(sym).encode())
        for c in children:
            if not (0 < c < n):
                raise ValueError("a child outside the plan")
            self.plan.children.push_back(c)
        for x in enum_codes:
            self.plan.enum_codes.push_back(x)
        self.plan.tables.resize(len(tables))
        for t, table in enumerate(tables):
            for key, code in table.items():
                self.plan.tables[t][key.encode()] = code
        for i, (kind, slot, a, b) in enumerate(nodes):
            if not (0 <= kind <= 13) or not (-2 <= slot < n_features):
                raise ValueError(f"node {i}: a bad kind or slot")
            if kind in (12, 13) and not (0 <= a and 0 <= b and a + b <= len(children)
                                         and all(c > i for c in children[a:a + b])):
                raise ValueError(f"node {i}: children outside the plan")
            if kind in (10, 11) and not (i < a < n):
                raise ValueError(f"node {i}: an item node outside the plan")
            if kind == 9 and not (0 <= a and 0 <= b and a + b <= len(enum_codes)):
                raise ValueError(f"node {i}: enum codes outside the plan")
            if kind == 8 and a < 0:
                raise ValueError(f"node {i}: a negative fixed size")
            if kind in (6, 7) and slot >= 0 and not (-(kind == 7) <= b < len(tables)):
                raise ValueError(f"node {i}: a category table outside the plan")
            if kind in (2, 3) and slot >= 0 and not (-1 <= b < len(tables)):
                raise ValueError(f"node {i}: a category table outside the plan")
            if kind == 0 and not (0 <= a and 0 <= b and a + b <= len(covers)):
                raise ValueError(f"node {i}: covered slots outside the plan")
            if kind in (10, 11) and b not in (0, 1):
                raise ValueError(f"node {i}: a bad item kind")
            if slot == -2:
                self.has_id = True
            node.kind, node.slot, node.a, node.b = kind, slot, a, b
            self.plan.nodes.push_back(node)
        # a tree: each node one parent (before it), at most 40 deep (the reader recurses)
        parents = [0] * n
        depth = [0] * n
        for i, (kind, slot, a, b) in enumerate(nodes):
            below = list(children[a:a + b]) if kind in (12, 13) else \
                [a] if kind in (10, 11) else []
            for c in below:
                parents[c] += 1
                depth[c] = depth[i] + 1
                if parents[c] > 1 or depth[c] > 40:
                    raise ValueError(f"node {c}: shared, or nested deeper than 40")

    def read(self, const unsigned char[::1] body):
        """One record's bytes (after the wire format's 5-byte head): as JsonReader.read."""
        cdef size_t n = body.shape[0]
        cdef const unsigned char* data = &body[0] if n else <const unsigned char*>b""
        cdef int rc
        if self.busy:
            raise RuntimeError("AvroReader.read is not reentrant: one reader a thread")
        self.busy = True
        try:
            with nogil:
                rc = self.reader.read(self.plan, data, n, self.out)
        finally:
            self.busy = False
        try:
            if rc:
                return _failure(self.out)
            return _result(self.out, self.has_id, self.any_hashed)
        finally:
            self.out.release()

    def counts(self):
        """The last read's (absent, unseen) per feature (int64 arrays), or None: none."""
        return _counts(self.out)


# ---- out: the scores of a group's messages as JSON, one value a message ---------------------

cdef extern from "json_rows.h" namespace "swjson" nogil:
    void _double "swjson::append_double"(string& out, double x)
    void _int "swjson::append_int"(string& out, long long x)


def encode_scores(const int64_t[::1] offsets, const unsigned char[::1] singles,
                  const int64_t[::1] int_ids, list id_texts, bytes id_key,
                  const double[::1] score, const int64_t[::1] label,
                  const int8_t[::1] decision, const int32_t[::1] work,
                  const int8_t[::1] stop_code, list stop_names, const double[::1] lo,
                  const double[::1] hi, list extra):
    """For message k (rows offsets[k]:offsets[k + 1]): ``{"<id>":..,"score":..,...}`` for a
    message that was one event (singles[k] and one row), else an array of them. Ids: int_ids
    (numbers), or id_texts (each row's id as JSON text) where int_ids is empty; label empty:
    a regressor; extra: each row's text before its ``}`` (reason codes), or None."""
    cdef Py_ssize_t k, i, n_msg = offsets.shape[0] - 1
    cdef Py_ssize_t n_rows = offsets[n_msg] if n_msg >= 0 else 0
    cdef bint has_int = int_ids.shape[0] > 0, has_label = label.shape[0] > 0
    if n_msg < 0 or singles.shape[0] != n_msg or score.shape[0] != n_rows or \
            lo.shape[0] != n_rows or hi.shape[0] != n_rows or decision.shape[0] != n_rows or \
            work.shape[0] != n_rows or stop_code.shape[0] != n_rows or \
            (has_label and label.shape[0] != n_rows) or \
            (has_int and int_ids.shape[0] != n_rows) or \
            (not has_int and (id_texts is None or len(id_texts) != n_rows)) or \
            (extra is not None and len(extra) != n_rows):
        raise ValueError("encode_scores: lengths disagree")
    for k in range(n_msg):
        if not (0 <= offsets[k] <= offsets[k + 1] <= n_rows):
            raise ValueError("encode_scores: offsets out of order")
    cdef vector[string] names
    for name in stop_names:
        names.push_back(<bytes>name)
    for i in range(n_rows):
        if not (0 <= stop_code[i] < <int8_t>names.size()):
            raise ValueError("encode_scores: a stop code without a name")
    cdef string key = id_key
    cdef string out
    cdef bint one
    values = []
    for k in range(n_msg):
        out.clear()
        one = singles[k] and offsets[k + 1] - offsets[k] == 1
        if not one:
            out.push_back(b"[")
        for i in range(offsets[k], offsets[k + 1]):
            if i > offsets[k]:
                out.push_back(b",")
            out.push_back(b"{")
            out.append(key)
            out.push_back(b":")
            if has_int:
                _int(out, int_ids[i])
            else:
                out.append(<bytes>id_texts[i])
            out.append(b',"score":')
            _double(out, score[i])
            if has_label:
                out.append(b',"label":')
                _int(out, label[i])
            out.append(b',"decision":')
            _int(out, decision[i])
            out.append(b',"work_units":')
            _int(out, work[i])
            out.append(b',"stop_reason":"')
            out.append(names[stop_code[i]])
            out.append(b'","score_lo":')
            _double(out, lo[i])
            out.append(b',"score_hi":')
            _double(out, hi[i])
            if extra is not None:
                out.append(<bytes>extra[i])
            out.push_back(b"}")
        if not one:
            out.push_back(b"]")
        values.append(<bytes>out)
    return values


# ---- serve: what a JSON request would build, before it is built ------------------------------

def json_shape(const unsigned char[::1] buf, Py_ssize_t max_depth, Py_ssize_t max_containers):
    """(deepest nesting, arrays and objects) of the JSON text ``buf``, strings skipped (their
    escapes honoured), without building anything; the scan stops as soon as either passes its
    bound (the caller refuses the request: issue 50, 16 MiB of ``[]`` took 674 MiB to parse).
    A text that is not JSON is left to the parser to refuse."""
    cdef Py_ssize_t i = 0, n = buf.shape[0], depth = 0, most = 0, containers = 0
    cdef unsigned char c
    with nogil:
        while i < n:
            c = buf[i]
            if c == 34:  # a string: to its closing quote
                i += 1
                while i < n:
                    c = buf[i]
                    if c == 92:  # a backslash: the next byte is escaped
                        i += 2
                        continue
                    if c == 34:
                        break
                    i += 1
            elif c == 91 or c == 123:
                depth += 1
                containers += 1
                if depth > most:
                    most = depth
                if most > max_depth or containers > max_containers:
                    break
            elif c == 93 or c == 125:
                depth -= 1
            i += 1
    return most, containers


from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.math cimport NAN


def json_row(list values not None, float[::1] out not None):
    """A one-row request's JSON values (floats, integers, None: orjson's objects) into
    ``out`` as float32, each as numpy's float64-then-float32 cast gives it (None: NaN; a
    float past float32: infinity); the number of None. -1, ``out`` part written, where the
    values are not for this path: their count is not ``out``'s, or one is of another kind
    (a boolean, a string, a list) or an integer beyond 2^53 in magnitude (not exact in
    float64: oip._json_values casts those once)."""
    cdef Py_ssize_t i, n = PyList_GET_SIZE(values), missing = 0
    cdef object v
    cdef long long k
    cdef int overflow = 0
    if n != out.shape[0]:
        return -1
    for i in range(n):
        v = <object>PyList_GET_ITEM(values, i)
        if v is None:
            out[i] = NAN
            missing += 1
        elif type(v) is float:
            out[i] = <float>PyFloat_AS_DOUBLE(v)
        elif type(v) is int:  # (not a bool: its type is bool)
            k = PyLong_AsLongLongAndOverflow(v, &overflow)
            if overflow != 0 or k > 9007199254740992 or k < -9007199254740992:
                return -1
            out[i] = <float>(<double>k)
        else:
            return -1
    return missing
