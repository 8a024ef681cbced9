"""The worker on secured brokers (deploy/kafka-local/broker --security sasl_ssl|mtls): the
ACLs docs/operations.md lists are enough and each one is needed, credentials come from files or the
environment and are never logged, and whoever lacks them (an intruder, a plaintext client, a
wrong password, a broker whose certificate does not name the host) is refused."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from tests import kafka_util as K
from tests.kafka_broker import create_topic

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parent.parent

# ---- the ACL list, read from docs/operations.md, Security (what an operator copies is what is
# tested) ----

_OPS = {"Read": AclOperation.READ, "Write": AclOperation.WRITE,
        "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS}
_TYPES = {"--topic": ResourceType.TOPIC, "--group": ResourceType.GROUP,
          "--transactional-id": ResourceType.TRANSACTIONAL_ID}
# the names the docs' lines use (config/prod.yaml's), replaced by each test's own
_README_NAMES = {"transactions": "in", "scores": "out", "scores-dlq": "dlq",
                 "scores-shadow": "shadow", "scoring-worker": "group",
                 "scoring-worker-": "txn_prefix"}
# what the worker says when one is missing: operation and resource type in its words
_SAID = {"Read": "READ", "Write": "WRITE", "DescribeConfigs": "DESCRIBE_CONFIGS"}


def readme_acls() -> dict[str, list[tuple[str, str, str, bool]]]:
    """The kafka-acls lines of docs/operations.md by section ("both", "exactly_once",
    "shadow"): (operation, resource flag, the docs' resource name, prefixed)."""
    text = (REPO / "docs" / "operations.md").read_text()
    block = text.split("**ACLs the worker needs**", 1)[1].split("```sh", 1)[1]
    block = block.split("```", 1)[0]
    out: dict[str, list] = {}
    section = None
    for line in block.splitlines():
        if line.startswith("# both"):
            section = "both"
        elif line.startswith("# exactly_once"):
            section = "exactly_once"
        elif line.startswith("# with model.shadow_path"):
            section = "shadow"
        elif line.startswith("kafka-acls"):
            args = line.split()
            assert "User:scoring-worker" in args, line
            op = args[args.index("--operation") + 1]
            flag = next(a for a in args if a in _TYPES)
            name = args[args.index(flag) + 1]
            out.setdefault(section, []).append((op, flag, name, "prefixed" in args))
    return out


def test_readme_lists_the_acls():
    acls = readme_acls()
    assert sorted(acls) == ["both", "exactly_once", "shadow"]
    assert len(acls["both"]) == 6 and len(acls["exactly_once"]) == 1
    assert ("Write", "--transactional-id", "scoring-worker-", True) in acls["exactly_once"]


def acls_for(mode: str) -> list[tuple[str, str, str, bool]]:
    acls = readme_acls()
    return acls["both"] + (acls["exactly_once"] if mode == "exactly_once" else [])


def bindings(acls, names: dict[str, str], principal: str = "User:worker") -> list[AclBinding]:
    out = []
    for op, flag, readme_name, prefixed in acls:
        name = names[_README_NAMES[readme_name]]
        out.append(AclBinding(_TYPES[flag], name,
                              ResourcePatternType.PREFIXED if prefixed
                              else ResourcePatternType.LITERAL,
                              principal, "*", _OPS[op], AclPermissionType.ALLOW))
    return out


def grant(admin: AdminClient, acls: list[AclBinding]) -> None:
    for fut in admin.create_acls(acls, request_timeout=30).values():
        fut.result(timeout=30)
    # the authorizer applies new ACLs as metadata records: wait until they are visible
    time.sleep(0.5)


# ---- fixtures ----

def names_for(admin: AdminClient, tag: str, partitions: int = 2) -> dict[str, str]:
    """Fresh topics (created by admin: the worker creates none), group and transactional-id
    prefix."""
    u = uuid.uuid4().hex[:10]
    names = {"in": f"in-{tag}-{u}", "out": f"scores-{tag}-{u}", "dlq": f"dlq-{tag}-{u}",
             "shadow": f"shadow-{tag}-{u}", "group": f"g-{tag}-{u}"}
    names["txn_prefix"] = f"{names['group']}-"
    create_topic(admin, names["in"], partitions=partitions)
    create_topic(admin, names["out"], partitions=partitions)
    create_topic(admin, names["dlq"], partitions=1)
    return names


def worker_config(path: Path, broker, names: dict, model: Path, mode: str,
                  secret: str = "file", user: str = "worker", **kafka) -> tuple[Path, dict]:
    """A worker config for ``user`` on ``broker``; the secret from a file (``secret="file"``)
    or the environment ("env"). Returns (config path, environment)."""
    conf = broker.client(user)
    env: dict[str, str] = {}
    section: dict = {"security_protocol": conf["security.protocol"],
                     "ssl_ca_location": conf["ssl.ca.location"]}
    secret_name, secret_value = None, None
    if conf["security.protocol"] == "SASL_SSL":
        section.update(sasl_mechanism=conf["sasl.mechanism"], sasl_username=conf["sasl.username"])
        secret_name, secret_value = "sasl_password", conf["sasl.password"]
    else:
        section.update(ssl_certificate_location=conf["ssl.certificate.location"],
                       ssl_key_location=conf["ssl.key.location"])
        secret_name, secret_value = "ssl_key_password", conf["ssl.key.password"]
    if secret == "file":
        f = path.parent / f"{path.stem}-{secret_name}"
        f.write_text(secret_value + "\n")  # as `kubectl create secret --from-file` may
        section[f"{secret_name}_file"] = str(f)
    else:
        env[f"SCORING_WORKER__KAFKA__{secret_name.upper()}"] = secret_value
    section.update(kafka)
    K.write_config(path, broker.bootstrap, model, names["in"], names["out"], names["dlq"],
                   group=names["group"], mode=mode, kafka=section)
    return path, env


def run_to_exit(config: Path, log: Path, env: dict, timeout: float = 60) -> tuple[int, str,
                                                                                    float]:
    t0 = time.monotonic()
    proc = K.start_worker(config, log, env)
    try:
        rc = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, log.read_text(), time.monotonic() - t0


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


# ---- delivery with exactly the documented ACLs ----

@pytest.mark.parametrize("mode,secret", [("exactly_once", "file"), ("at_least_once", "env")])
def test_exactly_the_readme_acls_deliver(tmp_path, sasl_ssl_broker, model_path, mode, secret):
    admin = sasl_ssl_broker.admin()
    names = names_for(admin, mode[:3])
    grant(admin, bindings(acls_for(mode), names))
    rows = K.produce_inputs(sasl_ssl_broker.client("admin"), names["in"], n_messages=20,
                            rows=10)
    p = Producer(sasl_ssl_broker.client("admin"))
    p.produce(names["in"], value=b"not an arrow stream", partition=0)
    assert p.flush(30) == 0
    cfg, env = worker_config(tmp_path / "w.yaml", sasl_ssl_broker, names, model_path, mode,
                             secret=secret)
    log = tmp_path / "worker.log"
    proc = K.start_worker(cfg, log, env)
    try:
        out = K.wait_for_ids(sasl_ssl_broker.client("admin"), names["out"], rows.num_rows,
                             timeout=120, proc=proc)
        dlq = K.read_topic(sasl_ssl_broker.client("admin"), names["dlq"], expect_messages=1,
                           timeout=60, idle=1.0)
    finally:
        rc = K.stop_worker(proc)
    text = log.read_text()
    assert rc == 0, text
    ids = K.output_ids(out)
    assert set(ids.tolist()) == set(range(rows.num_rows)), text[-3000:]
    if mode == "exactly_once":
        assert len(ids) == rows.num_rows  # each exactly once
    assert len(dlq) == 1 and dict(dlq[0].headers())["error_code"] == b"not_arrow"
    # the secret is never logged; the settings logged at start-up mask it
    secret_value = sasl_ssl_broker.client("worker")["sasl.password"]
    assert secret_value not in text
    assert "kafka settings" in text and "kafka access checked" in text


# ---- each ACL is needed ----

@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
def test_without_any_one_acl_the_worker_exits_1_naming_it(tmp_path, sasl_ssl_broker, model_path,
                                                          mode):
    """One worker per ACL of the mode, each with every other ACL on resources of its own, all
    at once: each exits 1 within 30 s, one line naming the missing operation and resource."""
    admin = sasl_ssl_broker.admin()
    acls = acls_for(mode)
    cases = []
    for i, left_out in enumerate(acls):
        names = names_for(admin, f"{mode[:3]}{i}", partitions=1)
        grant(admin, bindings([a for a in acls if a is not left_out], names))
        cfg, env = worker_config(tmp_path / f"w{i}.yaml", sasl_ssl_broker, names, model_path,
                                 mode)
        cases.append((left_out, names, cfg, env))
    procs = [(case, K.start_worker(case[2], tmp_path / f"w{i}.log", case[3]), time.monotonic())
             for i, case in enumerate(cases)]
    failures = []
    for i, ((left_out, names, _cfg, _env), proc, t0) in enumerate(procs):
        try:
            rc = proc.wait(max(1.0, 30 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        elapsed = time.monotonic() - t0
        text = (tmp_path / f"w{i}.log").read_text()
        op, flag, readme_name, _prefixed = left_out
        name = names[_README_NAMES[readme_name]]
        resource = {"--topic": "topic", "--group": "group",
                    "--transactional-id": "transactional-id"}[flag]
        lines = error_lines(text)
        said = f"{_SAID[op]} on {resource} {name}"
        if rc != 1 or len(lines) != 1 or said not in lines[0] or "Traceback" in text:
            failures.append(f"{left_out}: rc={rc} after {elapsed:.1f}s, wanted one line "
                            f"with {said!r}:\n{text[-2500:]}")
    assert not failures, "\n\n".join(failures)


# ---- who is refused ----

def test_intruder_and_plaintext_clients_are_refused(tmp_path, sasl_ssl_broker, model_path):
    admin = sasl_ssl_broker.admin()
    names = names_for(admin, "intr", partitions=1)
    grant(admin, bindings(acls_for("exactly_once"), names))  # granted to worker, not intruder
    errors = []
    p = Producer({**sasl_ssl_broker.client("intruder"), "message.timeout.ms": 10000})
    p.produce(names["out"], value=b"forged score", on_delivery=lambda e, m: errors.append(e))
    p.flush(15)
    assert [e.name() for e in errors] == ["TOPIC_AUTHORIZATION_FAILED"]
    c = Consumer({**sasl_ssl_broker.client("intruder"), "group.id": names["group"]})
    try:
        c.subscribe([names["in"]])
        seen = set()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not seen:
            for m in c.consume(10, 0.5):
                if m.error() is not None:
                    seen.add(m.error().name())
                else:
                    pytest.fail("the intruder read a message")
        assert seen & {"TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED"}, seen
    finally:
        c.close()
    # a plaintext client on the SASL_SSL listener gets nothing at all
    plain = AdminClient({"bootstrap.servers": sasl_ssl_broker.bootstrap})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)
    # the worker run as the intruder: exit 1, naming what it lacks
    cfg, env = worker_config(tmp_path / "i.yaml", sasl_ssl_broker, names, model_path,
                             "exactly_once", user="intruder")
    rc, text, elapsed = run_to_exit(cfg, tmp_path / "i.log", env, timeout=60)
    lines = error_lines(text)
    assert rc == 1 and len(lines) == 1 and "User:intruder is not authorized" in lines[0], text
    assert f"READ on topic {names['in']}" in lines[0] and elapsed < 30


def test_wrong_password_exits_1_at_start_up_with_one_line(tmp_path, sasl_ssl_broker, model_path):
    admin = sasl_ssl_broker.admin()
    names = names_for(admin, "pw", partitions=1)
    grant(admin, bindings(acls_for("exactly_once"), names))
    cfg, env = worker_config(tmp_path / "w.yaml", sasl_ssl_broker, names, model_path,
                             "exactly_once", secret="env")
    env["SCORING_WORKER__KAFKA__SASL_PASSWORD"] = "not-the-password-" + uuid.uuid4().hex
    rc, text, elapsed = run_to_exit(cfg, tmp_path / "w.log", env, timeout=60)
    lines = error_lines(text)
    assert rc == 1 and len(lines) == 1, text
    assert "refuse the connection of User:worker" in lines[0] and \
        "invalid credentials" in lines[0], text
    assert env["SCORING_WORKER__KAFKA__SASL_PASSWORD"] not in text and "Traceback" not in text
    assert elapsed < 30


class _Forward(threading.Thread):
    """A TCP forwarder from 127.0.0.2:PORT to the broker: the same broker, reached under a
    name its certificate does not carry."""

    def __init__(self, target: str):
        super().__init__(daemon=True)
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.2", 0))
        self.address = f"127.0.0.2:{self.listener.getsockname()[1]}"

    def run(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def test_hostname_verification_is_on_by_default(tmp_path, sasl_ssl_broker, model_path):
    admin = sasl_ssl_broker.admin()
    names = names_for(admin, "host", partitions=1)
    fwd = _Forward(sasl_ssl_broker.bootstrap)
    fwd.start()
    try:
        cfg, env = worker_config(tmp_path / "w.yaml", sasl_ssl_broker, names, model_path,
                                 "exactly_once", bootstrap_servers=fwd.address)
        rc, text, elapsed = run_to_exit(cfg, tmp_path / "w.log", env, timeout=60)
    finally:
        fwd.listener.close()
    lines = error_lines(text)
    assert rc == 1 and len(lines) == 1, text
    assert "certificate verify failed" in lines[0] and elapsed < 30, text


# ---- mutual TLS ----

def test_mutual_tls_exactly_once(tmp_path, mtls_broker, model_path):
    admin = mtls_broker.admin()
    names = names_for(admin, "mtls")
    grant(admin, bindings(acls_for("exactly_once"), names))
    rows = K.produce_inputs(mtls_broker.client("admin"), names["in"], n_messages=10, rows=10)
    cfg, env = worker_config(tmp_path / "w.yaml", mtls_broker, names, model_path,
                             "exactly_once", secret="file")
    log = tmp_path / "worker.log"
    proc = K.start_worker(cfg, log, env)
    try:
        out = K.wait_for_ids(mtls_broker.client("admin"), names["out"], rows.num_rows,
                             timeout=120, proc=proc)
    finally:
        rc = K.stop_worker(proc)
    text = log.read_text()
    assert rc == 0, text
    ids = K.output_ids(out)
    assert np.array_equal(np.sort(ids), np.arange(rows.num_rows)), text[-3000:]
    assert mtls_broker.client("worker")["ssl.key.password"] not in text
    # the intruder's certificate is valid, but it has no ACLs; no certificate: no handshake
    errors = []
    p = Producer({**mtls_broker.client("intruder"), "message.timeout.ms": 10000})
    p.produce(names["out"], value=b"forged", on_delivery=lambda e, m: errors.append(e))
    p.flush(15)
    assert [e.name() for e in errors] == ["TOPIC_AUTHORIZATION_FAILED"]
    no_cert = {k: v for k, v in mtls_broker.client("worker").items()
               if not k.startswith(("ssl.certificate", "ssl.key"))}
    with pytest.raises(KafkaException):
        AdminClient(no_cert).list_topics(timeout=5)


# ---- record and replay --topic reach the secured broker too ----

def test_replay_to_a_topic_and_record_it_back(tmp_path, sasl_ssl_broker, model_path):
    admin = sasl_ssl_broker.admin()
    names = names_for(admin, "rec", partitions=1)
    names["dlq"] = create_topic(admin, f"{names['out']}-dlq")  # replay --topic's dead letters
    rw = [("Write", "--topic", "scores", False), ("Write", "--topic", "scores-dlq", False),
          ("DescribeConfigs", "--topic", "scores", False),
          ("DescribeConfigs", "--topic", "scores-dlq", False),
          ("Read", "--topic", "scores", False)]  # record reads the scores back
    grant(admin, bindings(rw, names))
    cfg, env = worker_config(tmp_path / "w.yaml", sasl_ssl_broker, names, model_path,
                             "at_least_once", secret="file")
    recording = tmp_path / "input.arrows"
    from worker.io.records import Record, RecordWriter

    with RecordWriter(recording) as w:
        w.write([Record(names["in"], 0, i, None, K.arrow_bytes(K.input_table(i * 5, 5, i)), 0,
                        []) for i in range(6)])
    run = [sys.executable, "-m", "worker.cli"]
    import os

    e = {**os.environ, **env}
    rep = subprocess.run([*run, "replay", str(recording), "--config", str(cfg), "--topic",
                          names["out"]], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=e)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    out = tmp_path / "scores.arrows"
    rec = subprocess.run([*run, "record", "--config", str(cfg), "--topic", names["out"],
                          "--output", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=e)
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert re.search(r"recorded 6 messages", rec.stdout), rec.stdout


# ---- an ACL removed while the worker runs ----

@pytest.mark.parametrize("removed", [("Write", "--topic", "scores", False),
                                     ("Read", "--topic", "transactions", False),
                                     ("Write", "--transactional-id", "scoring-worker-", True)],
                         ids=["write-scores", "read-input", "write-transactional-id"])
def test_an_acl_removed_while_running_is_fatal_not_retried(tmp_path, sasl_ssl_broker, model_path,
                                                           removed):
    """Past the start-up check: the refusal met by the producer (a transaction aborted) or the
    consumer (a fetch) exits 1 within 30 s naming the permission, instead of retrying."""
    admin = sasl_ssl_broker.admin()
    names = names_for(admin, "rev", partitions=1)
    acls = acls_for("exactly_once")
    grant(admin, bindings(acls, names))
    K.produce_inputs(sasl_ssl_broker.client("admin"), names["in"], n_messages=5, rows=10,
                     partitions=1)
    cfg, env = worker_config(tmp_path / "w.yaml", sasl_ssl_broker, names, model_path,
                             "exactly_once")
    log = tmp_path / "worker.log"
    proc = K.start_worker(cfg, log, env)
    try:
        out = K.wait_for_ids(sasl_ssl_broker.client("admin"), names["out"], 50, timeout=90,
                             proc=proc)
        assert len(set(K.output_ids(out).tolist())) == 50, log.read_text()
        b = bindings([removed], names)[0]
        gone = AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal,
                                b.host, b.operation, b.permission_type)
        for fut in admin.delete_acls([gone], request_timeout=30).values():
            fut.result(timeout=30)
        t0 = time.monotonic()
        # more input: the next batch meets the refusal
        p = Producer(sasl_ssl_broker.client("admin"))
        for i in range(5):
            p.produce(names["in"], value=K.arrow_bytes(K.input_table(1000 + i * 10, 10, i)))
        assert p.flush(30) == 0
        rc = proc.wait(60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    lines = error_lines(text)
    op, flag, readme_name, _p = removed
    resource = {"--topic": "topic", "--transactional-id": "transactional-id"}[flag]
    said = f"{_SAID[op]} on {resource} {names[_README_NAMES[readme_name]]}"
    assert rc == 1 and len(lines) == 1 and said in lines[0], text[-3000:]
    assert elapsed < 30 and "Traceback" not in text
    # nothing of the refused batch was committed: the outputs are still the first 50 ids
    after = K.read_topic(sasl_ssl_broker.client("admin"), names["out"], idle=1.0, timeout=20)
    assert sorted(K.output_ids(after).tolist()) == list(range(50))


# ---- a credential revoked while the worker runs ----

def test_a_revoked_credential_stops_the_worker_instead_of_retrying(tmp_path, sasl_ssl_broker,
                                                                  model_path):
    """The broker re-authenticates clients every 10 s (connections.max.reauth.ms): once the
    user's SCRAM credential is deleted, every attempt is refused, and after 30 s of refusals
    the worker exits 1 with one line (a pod whose credentials went bad is restarted, not
    left retrying behind a passing health check)."""
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = sasl_ssl_broker.admin()
    user, password = f"rot-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    for fut in admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
            password.encode())]).values():
        fut.result(timeout=30)
    names = names_for(admin, "rot", partitions=1)
    grant(admin, bindings(acls_for("at_least_once"), names, principal=f"User:{user}"))
    K.produce_inputs(sasl_ssl_broker.client("admin"), names["in"], n_messages=5, rows=10,
                     partitions=1)
    cfg, env = worker_config(tmp_path / "w.yaml", sasl_ssl_broker, names, model_path,
                             "at_least_once", secret="env", sasl_username=user)
    env["SCORING_WORKER__KAFKA__SASL_PASSWORD"] = password
    log = tmp_path / "worker.log"
    proc = K.start_worker(cfg, log, env)
    try:
        out = K.wait_for_ids(sasl_ssl_broker.client("admin"), names["out"], 50, timeout=90,
                             proc=proc)
        assert len(set(K.output_ids(out).tolist())) == 50, log.read_text()
        for fut in admin.alter_user_scram_credentials([UserScramCredentialDeletion(
                user, ScramMechanism.SCRAM_SHA_512)]).values():
            fut.result(timeout=30)
        t0 = time.monotonic()
        rc = proc.wait(90)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    lines = error_lines(text)
    assert rc == 1 and len(lines) == 1, text[-3000:]
    assert f"refused the credentials of User:{user} for 30 s" in lines[0], lines
    assert elapsed < 60 and "Traceback" not in text and password not in text
