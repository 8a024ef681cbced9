"""``scoring-worker serve``: synchronous scoring over the Open Inference Protocol (KServe v2).

``oip``: the protocol's request and response bodies; ``service``: the routes over one model
(hot swap, metrics); ``server``: the HTTP server and its worker processes.
"""
