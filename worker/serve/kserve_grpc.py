"""The Open Inference Protocol's gRPC half (KServe v2, ``inference.GRPCInferenceService``):
ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer, served by
``grpc.aio`` on the same event loop as HTTP, over the same ``Service`` (one hot-swapped model,
the same parsing, bounds, scoring and metrics).

The messages are described here (``_FILE``: names, field numbers and types of the protocol's
``grpc_predict_v2.proto``, in a descriptor pool of their own), so nothing is generated at
build time; tests/test_serve_grpc.py checks each against the stubs Triton's client ships and
talks to the server with that client.

A request becomes the document the HTTP binary extension would have sent: raw tensors
(``raw_input_contents``) are its binary data, typed contents its JSON values; an answer's
outputs are always raw (``raw_output_contents``: the form clients read). Errors map to gRPC
codes (400 INVALID_ARGUMENT, 404 NOT_FOUND, 413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 500
INTERNAL) with the message HTTP would give.
"""

from __future__ import annotations

import errno
import time

import grpc
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from .. import __version__
from . import oip
from .http import MAX_HEAVY_WAITING, Busy

SERVICE = "inference.GRPCInferenceService"
METHODS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
           "ModelInfer")
_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_T = {"bool": _F.TYPE_BOOL, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64,
      "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64, "float": _F.TYPE_FLOAT,
      "double": _F.TYPE_DOUBLE, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES}

# message -> fields (number, name, type or message, repeated); "map" fields: string -> type
_PARAMS = (4, "parameters", "map:InferParameter", False)
_MESSAGES = {
    "ServerLiveRequest": [], "ServerLiveResponse": [(1, "live", "bool", False)],
    "ServerReadyRequest": [], "ServerReadyResponse": [(1, "ready", "bool", False)],
    "ModelReadyRequest": [(1, "name", "string", False), (2, "version", "string", False)],
    "ModelReadyResponse": [(1, "ready", "bool", False)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [(1, "name", "string", False), (2, "version", "string", False),
                               (3, "extensions", "string", True)],
    "ModelMetadataRequest": [(1, "name", "string", False), (2, "version", "string", False)],
    "ModelMetadataResponse": [(1, "name", "string", False), (2, "versions", "string", True),
                              (3, "platform", "string", False),
                              (4, "inputs", ".ModelMetadataResponse.TensorMetadata", True),
                              (5, "outputs", ".ModelMetadataResponse.TensorMetadata", True)],
    "ModelMetadataResponse.TensorMetadata": [(1, "name", "string", False),
                                             (2, "datatype", "string", False),
                                             (3, "shape", "int64", True)],
    "InferParameter": [(1, "bool_param", "bool", False), (2, "int64_param", "int64", False),
                       (3, "string_param", "string", False),
                       (4, "double_param", "double", False),
                       (5, "uint64_param", "uint64", False)],
    "InferTensorContents": [(1, "bool_contents", "bool", True), (2, "int_contents", "int32", True),
                            (3, "int64_contents", "int64", True),
                            (4, "uint_contents", "uint32", True),
                            (5, "uint64_contents", "uint64", True),
                            (6, "fp32_contents", "float", True),
                            (7, "fp64_contents", "double", True),
                            (8, "bytes_contents", "bytes", True)],
    "ModelInferRequest": [(1, "model_name", "string", False), (2, "model_version", "string", False),
                          (3, "id", "string", False), _PARAMS,
                          (5, "inputs", ".ModelInferRequest.InferInputTensor", True),
                          (6, "outputs", ".ModelInferRequest.InferRequestedOutputTensor", True),
                          (7, "raw_input_contents", "bytes", True)],
    "ModelInferRequest.InferInputTensor": [(1, "name", "string", False),
                                           (2, "datatype", "string", False),
                                           (3, "shape", "int64", True), _PARAMS,
                                           (5, "contents", ".InferTensorContents", False)],
    "ModelInferRequest.InferRequestedOutputTensor": [(1, "name", "string", False),
                                                     (2, "parameters", "map:InferParameter",
                                                      False)],
    "ModelInferResponse": [(1, "model_name", "string", False),
                           (2, "model_version", "string", False), (3, "id", "string", False),
                           _PARAMS,
                           (5, "outputs", ".ModelInferResponse.InferOutputTensor", True),
                           (6, "raw_output_contents", "bytes", True)],
    "ModelInferResponse.InferOutputTensor": [(1, "name", "string", False),
                                             (2, "datatype", "string", False),
                                             (3, "shape", "int64", True), _PARAMS,
                                             (5, "contents", ".InferTensorContents", False)],
}
_ONEOF = {"InferParameter": "parameter_choice"}


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="scoring_worker/grpc_predict_v2.proto",
                                           package="inference", syntax="proto3")
    protos: dict[str, descriptor_pb2.DescriptorProto] = {}
    for path in sorted(_MESSAGES, key=lambda p: p.count(".")):
        parent, _, leaf = path.rpartition(".")
        d = (protos[parent].nested_type.add() if parent else f.message_type.add())
        d.name = leaf
        protos[path] = d
    for path, fields in _MESSAGES.items():
        d = protos[path]
        if path in _ONEOF:
            d.oneof_decl.add(name=_ONEOF[path])
        for number, name, kind, repeated in fields:
            fd = d.field.add(name=name, number=number, label=_REP if repeated else _OPT)
            if path in _ONEOF:
                fd.oneof_index = 0
            if kind.startswith("map:"):  # map<string, V>: a repeated nested entry message
                entry = d.nested_type.add(name=name.title().replace("_", "") + "Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, label=_OPT, type=_F.TYPE_STRING)
                entry.field.add(name="value", number=2, label=_OPT, type=_F.TYPE_MESSAGE,
                                type_name=".inference." + kind[4:])
                fd.label = _REP
                fd.type = _F.TYPE_MESSAGE
                fd.type_name = f".inference.{path}.{entry.name}"
            elif kind.startswith("."):
                fd.type = _F.TYPE_MESSAGE
                fd.type_name = ".inference" + kind
            elif kind in _T:
                fd.type = _T[kind]
            else:
                fd.type = _F.TYPE_MESSAGE
                fd.type_name = ".inference." + kind
            if repeated and kind in _T and kind not in ("string", "bytes"):
                fd.options.packed = True
    service = f.service.add(name=SERVICE.split(".")[1])
    for name in METHODS:
        service.method.add(name=name, input_type=f".inference.{name}Request",
                           output_type=f".inference.{name}Response")
    return f


_POOL = descriptor_pool.DescriptorPool()
_FILE = _POOL.Add(_file())
M = {path: message_factory.GetMessageClass(_POOL.FindMessageTypeByName("inference." + path))
     for path in _MESSAGES}

# datatype -> the typed contents field that may carry it (FP16: raw only)
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}
HEAVY_MESSAGE = 64 << 10  # a request past this is answered on the heavy lane


def _param(p) -> object:
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def to_doc(request) -> tuple[dict, bytes]:
    """A ModelInferRequest as the document and binary data of the HTTP binary extension: raw
    tensors are its binary data; typed contents its JSON values (BYTES ones laid out as the
    binary extension lays them out: a 4-byte length before each)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise oip.bad(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    inputs, blobs = [], []
    for i, t in enumerate(request.inputs):
        if len(t.name.encode()) > oip.MAX_NAME or len(t.datatype) > 16:
            raise oip.bad(f"inputs[{i}]: a name of at most {oip.MAX_NAME} bytes and a datatype "
                          "of the protocol's are needed")
        d = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        params = {k: _param(v) for k, v in t.parameters.items()}
        has = [f.name for f, _ in t.contents.ListFields()] if t.HasField("contents") else []
        if raw:
            if has:
                raise oip.bad(f"input {t.name!r}: contents and raw_input_contents both given")
            params["binary_data_size"] = len(raw[i])
            blobs.append(raw[i])
        else:
            want = _CONTENTS.get(t.datatype)
            if len(has) > 1 or has and has[0] != want:
                raise oip.bad(f"input {t.name!r}: {t.datatype} values go in "
                              f"{want or 'raw_input_contents'}, not {', '.join(has)}")
            values = getattr(t.contents, want) if want else ()
            if t.datatype == "BYTES":
                blob = b"".join(len(v).to_bytes(4, "little") + v for v in values)
                params["binary_data_size"] = len(blob)
                blobs.append(blob)
            else:
                d["data"] = list(values)
        if params:
            d["parameters"] = params
        inputs.append(d)
    doc = {"inputs": inputs, "parameters": {k: _param(v) for k, v in
                                            request.parameters.items()}}
    if request.outputs:
        doc["outputs"] = [{"name": o.name} for o in request.outputs]
    if request.id:
        doc["id"] = request.id
    return doc, b"".join(blobs)


def to_response(model_name: str, model_id: str, req: oip.InferRequest, arrays: dict):
    out = M["ModelInferResponse"](model_name=model_name, model_version=model_id,
                                  id=req.id or "")
    out.parameters["model_id"].string_param = model_id
    for name in req.outputs:
        datatype, shape, values = arrays[name]
        out.outputs.add(name=name, datatype=datatype, shape=shape)
        if datatype == "BYTES":
            out.raw_output_contents.append(
                b"".join(len(v).to_bytes(4, "little") + v for v in values))
        else:
            out.raw_output_contents.append(np.ascontiguousarray(values).tobytes())
    return out


class Handlers:
    """The service's six RPCs over ``service`` (worker.serve.service.Service)."""

    def __init__(self, service, lane):
        self.service, self.lane = service, lane

    def _fail(self, context, status: int, message: str):
        self.service.metrics.answered("grpc", status)
        return context.abort(_CODES.get(status, grpc.StatusCode.INTERNAL), message)

    async def ServerLive(self, request, context):  # noqa: N802 (the protocol's names)
        return M["ServerLiveResponse"](live=True)

    async def ServerReady(self, request, context):  # noqa: N802
        return M["ServerReadyResponse"](ready=self.service.current is not None)

    async def ModelReady(self, request, context):  # noqa: N802
        m = self.service._model()
        ready = (m is not None and request.name == self.service.name and
                 (not request.version or len(request.version) >= 6 and
                  m.model.model_id.startswith(request.version)))
        return M["ModelReadyResponse"](ready=ready)

    async def ServerMetadata(self, request, context):  # noqa: N802
        return M["ServerMetadataResponse"](name="scoring-worker", version=__version__,
                                           extensions=["binary_tensor_data", "arrow_stream"])

    def _model_for(self, name: str, version: str):
        svc = self.service
        if name != svc.name:
            raise oip.RequestError(404, f"unknown model {name[:100]!r} (this server serves "
                                        f"{svc.name!r})")
        m = svc._model()
        if m is None:
            raise oip.RequestError(503, "the model is loading")
        if version and (len(version) < 6 or not m.model.model_id.startswith(version)):
            from .service import version_refused

            raise oip.RequestError(404, version_refused(name, version, m))
        return m

    async def ModelMetadata(self, request, context):  # noqa: N802
        try:
            m = self._model_for(request.name, request.version)
        except oip.RequestError as exc:
            return await self._fail(context, exc.status, exc.message)
        meta = m.meta
        out = M["ModelMetadataResponse"](name=meta["name"], versions=meta["versions"],
                                         platform=meta["platform"])
        for t in meta["inputs"]:
            out.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        for t in meta["outputs"]:
            out.outputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return out

    def _infer(self, request, m):
        svc = self.service
        doc, binary = to_doc(request)
        req = oip.parse_doc(doc, binary, m.contract, svc.serve.max_rows, m.classifier,
                            svc.scoring.explain is not None)
        req.binary = set(req.outputs)  # every output raw
        arrays = svc.infer_tensors(m, req)
        return to_response(svc.name, m.model.model_id, req, arrays)

    def _infer_raw(self, raw: bytes):
        """A ModelInferRequest's bytes read (here, not by grpc before the handler: a message
        of two million empty tensors took 176 MiB to read, and 64 calls were read at once),
        its tensors counted before anything is built from them, then scored."""
        request = _parse("ModelInferRequest", raw)
        if len(request.inputs) > oip.MAX_TENSORS or len(request.outputs) > oip.MAX_TENSORS:
            raise oip.bad(f"{len(request.inputs)} inputs and {len(request.outputs)} outputs: "
                          f"at most {oip.MAX_TENSORS} of each")
        m = self._model_for(request.model_name, request.model_version)
        return self._infer(request, m)

    async def ModelInfer(self, raw: bytes, context):  # noqa: N802
        svc = self.service
        t0 = time.perf_counter()
        try:
            if len(raw) > HEAVY_MESSAGE or b"reason_" in raw or (
                    svc.scoring.explain is not None and len(raw) > 2048):
                out = await self.lane.run(self._infer_raw, raw)
            else:
                out = self._infer_raw(raw)
        except Busy:
            return await self._fail(context, 503, f"{MAX_HEAVY_WAITING} large requests wait "
                                                  "to be answered: try again")
        except oip.RequestError as exc:
            return await self._fail(context, exc.status, exc.message)
        except Exception as exc:  # noqa: BLE001 (one request never stops the server)
            from .service import log

            log.error("grpc request failed", error=f"{type(exc).__name__}: {exc}"[:500])
            return await self._fail(context, 500, f"internal error: {type(exc).__name__}")
        svc.metrics.answered("grpc", 200)
        svc.metrics.by_kind["grpc"].observe(time.perf_counter() - t0)
        return out


def _parse(message: str, raw: bytes):
    """``raw`` as the protocol's ``message``, or a 400 saying it is not one."""
    try:
        return M[message].FromString(raw)
    except DecodeError as exc:
        raise oip.bad(f"not a {message} (protobuf): {str(exc)[:200]}") from None


def _handlers(h: Handlers) -> grpc.GenericRpcHandler:
    def unary(name: str, req: str, resp: str):
        if name == "ModelInfer":  # read in its handler (Handlers._infer_raw)
            handler = h.ModelInfer
        else:
            fn = getattr(h, name)

            async def handler(raw, context, fn=fn, req=req):
                try:
                    request = _parse(req, raw)
                except oip.RequestError as exc:
                    return await h._fail(context, exc.status, exc.message)
                return await fn(request, context)
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=None,
            response_serializer=M[resp].SerializeToString)

    return grpc.method_handlers_generic_handler(SERVICE, {
        n: unary(n, f"{n}Request", f"{n}Response") for n in METHODS})


def server_options(serve, reuse_port: bool) -> list[tuple[str, int]]:
    """grpc core's bounds from ``serve``: a message is received whole before its handler
    runs, so messages past serve.grpc_max_message_bytes are refused by grpc core
    (RESOURCE_EXHAUSTED), and answers past serve.max_response_bytes are never sent."""
    return [("grpc.max_receive_message_length", serve.grpc_max_message_bytes),
            ("grpc.max_send_message_length", serve.max_response_bytes),
            ("grpc.max_metadata_size", serve.max_header_bytes),
            # one connection holds at most 16 of the calls at once, and is recycled (GOAWAY,
            # then request_timeout_ms for what it has in flight) after keepalive_timeout_ms:
            # a call whose message never comes holds its slot that long at most
            ("grpc.max_concurrent_streams", 16),
            ("grpc.max_connection_idle_ms", serve.keepalive_timeout_ms),
            ("grpc.max_connection_age_ms", serve.keepalive_timeout_ms),
            ("grpc.max_connection_age_grace_ms", serve.request_timeout_ms),
            ("grpc.server_handshake_timeout_ms", serve.request_timeout_ms),
            ("grpc.http2.max_ping_strikes", 2),
            ("grpc.so_reuseport", int(reuse_port))]


async def start(service, lane, host: str, port: int, reuse_port: bool = False):
    """A grpc.aio server on ``host:port`` (0: one the system picks) over ``service``, and the
    port; at most serve.max_buffered_bytes / serve.grpc_max_message_bytes calls at once (grpc
    core holds each one's message whole); ``reuse_port``: other processes serve it too."""
    serve = service.serve
    calls = max(1, serve.max_buffered_bytes // serve.grpc_max_message_bytes)
    server = grpc.aio.server(options=server_options(serve, reuse_port),
                             maximum_concurrent_rpcs=calls)
    server.add_generic_rpc_handlers((_handlers(Handlers(service, lane)),))
    try:
        bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else
                                         f"{host}:{port}")
    except RuntimeError:  # grpc's "Failed to bind": the port is taken, or not ours
        bound = 0
    if bound == 0:
        raise OSError(errno.EADDRINUSE, "the gRPC port is in use, or not allowed")
    await server.start()
    return server, bound
