"""Toxiproxy (Shopify's TCP fault proxy) in front of the local three-node cluster: network
faults between a worker and its brokers, the brokers and the tests' own clients untouched.

Each cluster node has a second client listener, PROXIED (deploy/kafka-local/broker: node N
listens on 29592+N-1 and advertises 29692+N-1); one proxy per node listens on the advertised
port and forwards to the listener. A client bootstrapped at ``Toxiproxy.bootstrap`` learns
only the proxies' addresses from the brokers' metadata, so all its traffic (fetches, produces,
the group and transaction coordinators) goes through them; the inputs the tests produce and
the outputs they read use the plain ports.

The server is Toxiproxy v2.12.0, built from the Go module proxy on first use (``go install``,
cached under ~/.cache/scoring-worker) unless ``TOXIPROXY_SERVER`` names a binary. Its HTTP
API (https://github.com/Shopify/toxiproxy#http-api) is a handful of JSON calls, made here with
the standard library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

VERSION = "v2.12.0"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "scoring-worker" \
    / f"toxiproxy-{VERSION}"
API_PORT = 29892
CLUSTER_PORT = int(os.environ.get("KAFKA_LOCAL_CLUSTER_PORT", "29192"))
NODES = (1, 2, 3)


def listener_port(node: int) -> int:
    """The node's PROXIED listener (the proxy's upstream)."""
    return CLUSTER_PORT + 400 + node - 1


def proxy_port(node: int) -> int:
    """Where the node's proxy listens: the port the PROXIED listener advertises."""
    return CLUSTER_PORT + 500 + node - 1


class Unavailable(RuntimeError):
    """No Toxiproxy server here and none could be built (no Go)."""


def server_binary() -> Path:
    """The server binary: $TOXIPROXY_SERVER, or the cached build, built now if absent
    (``go install MODULE@VERSION``, ~10 s with a warm module cache, ~1 minute cold)."""
    named = os.environ.get("TOXIPROXY_SERVER")
    if named:
        return Path(named)
    binary = CACHE / "server"
    if binary.exists():
        return binary
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)
    if go is None:
        raise Unavailable(f"toxiproxy not found and no Go to build it: go install "
                          f"{MODULE}@{VERSION} (docs/operations.md)")
    CACHE.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([go, "install", f"{MODULE}@{VERSION}"], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "GOBIN": str(CACHE)})
    if proc.returncode != 0 or not binary.exists():
        raise Unavailable(f"toxiproxy not found: go install {MODULE}@{VERSION} failed: "
                          f"{proc.stderr.strip()[-500:]}")
    return binary


class Toxiproxy:
    """A running server with one proxy per cluster node (``kafka-1`` .. ``kafka-3``)."""

    def __init__(self, log: Path, port: int = API_PORT):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([str(server_binary()), "-host", "127.0.0.1", "-port",
                                      str(port)], stdout=open(log, "ab"),  # noqa: SIM115
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                self._call("GET", "/version")
                break
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"toxiproxy did not start (see {log})") from None
                time.sleep(0.1)
        for node in NODES:
            self._call("POST", "/proxies", {
                "name": self.name(node), "listen": f"127.0.0.1:{proxy_port(node)}",
                "upstream": f"127.0.0.1:{listener_port(node)}", "enabled": True})

    @property
    def bootstrap(self) -> str:
        """A worker's ``bootstrap_servers``: the proxies."""
        return ",".join(f"127.0.0.1:{proxy_port(n)}" for n in NODES)

    @staticmethod
    def name(node: int) -> str:
        return f"kafka-{node}"

    def _call(self, method: str, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (loopback)
            raw = resp.read()
        return json.loads(raw) if raw else None

    # -- faults
    def add(self, node: int, kind: str, stream: str = "downstream", toxicity: float = 1.0,
            **attributes) -> str:
        """A toxic on one node's proxy, in one direction (``upstream``: client to broker;
        ``downstream``: broker to client). Returns its name (for ``remove``)."""
        name = f"{kind}-{stream}"
        self._call("POST", f"/proxies/{self.name(node)}/toxics",
                   {"name": name, "type": kind, "stream": stream, "toxicity": toxicity,
                    "attributes": attributes})
        return name

    def remove(self, node: int, name: str) -> None:
        self._call("DELETE", f"/proxies/{self.name(node)}/toxics/{name}")

    def enable(self, node: int, enabled: bool) -> None:
        """A disabled proxy closes its connections and refuses new ones: the node is
        unreachable (for the clients behind the proxy only)."""
        self._call("POST", f"/proxies/{self.name(node)}", {"enabled": enabled})

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self._call("POST", "/reset")

    def toxics(self, node: int) -> list[dict]:
        return self._call("GET", f"/proxies/{self.name(node)}/toxics")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
