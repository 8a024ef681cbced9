"""The one-row JSON request, answered without the general path's layers (issue 50).

A fraud authorization is one row: ``{"inputs": [{"name": ..., "shape": [1, n], "datatype":
"FP32", "data": [...]}]}``. Through ``oip.parse_infer``, ``score_batch`` and
``oip.encode_response`` it took about 55 us in a loop and two thirds of a request's time in
the server (bench/serve_floor.py), most of it in small numpy arrays and Python layers built
for any number of rows, outputs and forms. ``OneRow.answer`` reads that one shape only, with
the same checks, scores it with the kernels' one-row call (``Forest.small``, the call
``score_batch`` makes for it) and writes the answer from bytes made once a model.

It answers only what it can answer exactly as the general path does, byte for byte: any
other request (another form, datatype, key or value kind, an id that is not a string, a
bound near, the model or settings not of the kind below) gets None and the general path,
which answers it or refuses it with its reason. tests/test_serve_onerow.py holds the two
paths' answers equal on hostile requests and the scores equal the libraries'.

The kind of model and settings it answers for: a binary classifier whose probabilities the
kernels compute (``CompiledModel._proba_link``; no hashed categories, no category names),
every tree evaluated (``scoring.lazy.mode: off``), no reason codes asked for every request
(``scoring.explain``).
"""

from __future__ import annotations

import bisect

import numpy as np
import orjson

from .._eventread import json_row
from ..model.result import STOP_REASONS
from . import oip

_DATATYPES = ("FP32", "FP64")  # float32 and float64 tensors read numbers alike
_KEYS = frozenset(("name", "shape", "datatype", "data"))
_MARK = b"\x01"  # where a value goes in the answer's bytes (never in orjson's output)


class OneRow:
    """A model's one-row answers (``of`` gives None for a model or settings it is not for)."""

    __slots__ = ("forest", "link", "n_features", "index", "thresholds", "head", "tails",
                 "work", "bound", "max_json", "max_answer")

    @classmethod
    def of(cls, model, name: str, scoring, serve, contract: oip.Contract) -> OneRow | None:
        if model.task != "binary" or model._proba_link is None or contract.categories or \
                scoring.lazy.mode != "off" or scoring.explain is not None or \
                serve.max_rows < 1:
            return None
        one = cls(model, name, scoring, serve, contract)
        return one if one.bound <= one.max_answer else None  # (every answer 413 there)

    def __init__(self, model, name: str, scoring, serve, contract: oip.Contract):
        self.forest = model.forest
        self.link = model._proba_link
        self.n_features = model.n_features
        self.index = contract.index
        self.thresholds = sorted(float(t) for t in scoring.thresholds)
        self.work = int(model.work_total)
        outputs = oip._default_outputs(True, False)
        req = oip.InferRequest(None, np.zeros((1, self.n_features), np.float32), outputs)
        self.bound = oip.answer_bound(req, 1, 0, oip.longest(STOP_REASONS.tolist()),
                                      oip.longest(model.feature_names))
        self.max_json = serve.max_json_bytes
        self.max_answer = serve.max_response_bytes
        # the answer encode_response writes, its score marked: for each label and band, the
        # bytes after the score up to the id (the id, when a request has one, is last)
        self.head, self.tails = b"", {}
        for label in (0, 1):
            for band in range(len(self.thresholds) + 1):
                arrays = {
                    "score": ("FP64", [1], [orjson.Fragment(_MARK)]),
                    "label": ("INT64", [1], np.array([label], np.int64)),
                    "decision": ("INT8", [1], np.array([band], np.int8)),
                    "work_units": ("INT32", [1], np.array([self.work], np.int32)),
                    "stop_reason": ("BYTES", [1], [STOP_REASONS[0].encode()]),
                }
                out, _ = oip.encode_response(name, model.model_id, req, arrays)
                head, tail = out.split(_MARK)
                assert tail.endswith(b"}") and (not self.head or head == self.head)
                self.head, self.tails[label, band] = head, tail[:-1]

    def answer(self, body: bytes):
        """(the answer's bytes, the row as float32 (1, n), its missing values, its score and
        band as arrays) for a one-row request of the shape above; None for anything else."""
        if len(body) > self.max_json or body.count(b"[") + body.count(b"{") > oip.MAX_DEPTH:
            return None  # (at most MAX_DEPTH containers: the general path's bound holds)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None  # (NaN literals, or an error the general path names)
        if type(doc) is not dict or not 1 <= len(doc) <= 2:
            return None
        inputs = doc.get("inputs")
        req_id = doc.get("id")
        if len(doc) == 2 and (req_id is None or type(req_id) is not str):
            return None  # another key, or an id the general path reads or refuses
        if type(inputs) is not list or len(inputs) != 1:
            return None
        t = inputs[0]
        if type(t) is not dict or t.keys() != _KEYS:
            return None
        name, shape, data = t["name"], t["shape"], t["data"]
        nf = self.n_features
        if type(name) is not str or not name or name in self.index or \
                len(name.encode()) > oip.MAX_NAME or t["datatype"] not in _DATATYPES or \
                type(shape) is not list or len(shape) != 2 or type(shape[0]) is not int or \
                type(shape[1]) is not int or shape[0] != 1 or shape[1] != nf or \
                type(data) is not list or not data:
            return None
        if type(data[0]) is list:  # nested: one row
            if len(data) != 1 or type(data[0]) is not list:
                return None
            data = data[0]
        if req_id is not None and self.bound + 6 * len(req_id) > self.max_answer:
            return None  # (413 there)
        X = np.empty((1, nf), np.float32)
        missing = json_row(data, X[0])
        if missing < 0:
            return None  # another kind of value, or another count: the general path's
        p = self.forest.small(X, self.link)
        if p is None:
            return None
        score = p[:, 1]
        s = float(score[0])
        band = bisect.bisect_right(self.thresholds, s)
        tail = self.tails[int(s > float(p[0, 0])), band]
        out = self.head + orjson.dumps(s) + tail + (
            b"}" if req_id is None else b',"id":' + orjson.dumps(req_id) + b"}")
        return out, X, missing, score, np.array([band], np.int8)
