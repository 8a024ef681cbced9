"""Who the worker is to the brokers, and what it may do there.

``check_access`` runs before the consumer and producer start: it authenticates (a wrong password,
an unknown CA, a certificate the broker refuses: exit 1 with one line) and asks the brokers which
operations this principal may perform on each topic and on the consumer group (Metadata and
DescribeGroups with ``include_authorized_operations``), so a missing ACL is named at start-up
instead of surfacing as a stalled consumer or a retried transaction. What the worker needs, per
delivery mode, is ``required`` (docs/operations.md's "Security" section lists the same as kafka-acls
lines). A refusal that comes later (an ACL removed while the worker runs, a transactional id
it may not use) is ``NotAuthorized`` at the point it happens: fatal, exit 1, never retried.
"""

from __future__ import annotations

import time

import structlog
from confluent_kafka import KafkaError, KafkaException

from .base import CredentialsRejected, NotAuthorized, Permission, StartupError

log = structlog.get_logger("worker.kafka")

# the settings an admin client shares with the consumer and producer: brokers, security,
# connections
_CLIENT_PREFIXES = ("bootstrap.", "security.", "sasl.", "ssl.", "client.", "socket.", "broker.",
                    "metadata.", "api.", "connections.", "reconnect.", "enable.ssl.",
                    "enable.sasl.", "https.")


def admin_config(conf: dict) -> dict:
    """An admin client's share of a consumer's or producer's settings: the brokers, security
    and connection settings."""
    return {k: v for k, v in conf.items() if k.startswith(_CLIENT_PREFIXES) or k == "logger"}

# broker error code -> the resource type it refuses
AUTHORIZATION_ERRORS = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional-id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}
# the connection itself is refused: credentials, certificates
AUTHENTICATION_ERRORS = frozenset({KafkaError._AUTHENTICATION,
                                   KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL})
# a coordinator still loading, or a broker not answering yet: asked again until the bound
_TRANSIENT = frozenset({KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                        KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
                        KafkaError._TIMED_OUT, KafkaError.LEADER_NOT_AVAILABLE,
                        KafkaError._TRANSPORT})

class AuthWatch:
    """A client's ``error_cb``: authentication refused without a break for ``bound_s`` raises
    CredentialsRejected (confluent-kafka re-raises it from the poll, consume or flush that
    served the callback), so a worker whose credentials went bad exits instead of retrying
    for ever while its health check passes. Other errors are librdkafka's to retry."""

    def __init__(self, principal: str, bound_s: float = 30.0):
        self.principal, self.bound_s = principal, bound_s
        self.first: float | None = None
        self.last: float | None = None

    def __call__(self, err) -> None:
        if err.code() not in AUTHENTICATION_ERRORS:
            return
        now = time.monotonic()
        if self.last is None or now - self.last > self.bound_s:
            self.first = now  # a new run of refusals
            log.warning("the brokers refuse this worker's credentials", error=err.str(),
                        exits_in_s=self.bound_s)
        self.last = now
        if now - self.first >= self.bound_s:
            raise CredentialsRejected(f"kafka: the brokers have refused the credentials of "
                                      f"{self.principal} for {self.bound_s:.0f} s: {err.str()}")


class AuthenticationFailed(StartupError):
    """The brokers refuse the connection: credentials or certificates (exit 1)."""

    def __init__(self, error: str, principal: str):
        super().__init__("kafka", f"the brokers refuse the connection of {principal} "
                                  f"(credentials or certificates): {error}", exit_code=1)


def transactional_id_permission(settings) -> Permission:
    k = settings.kafka
    if k.transactional_id:
        return Permission("WRITE", "transactional-id", k.transactional_id,
                          why="exactly once: the producer's transactions")
    return Permission("WRITE", "transactional-id", f"{k.group_id}-", prefixed=True,
                      why="exactly once: the producer's transactions (default ids "
                          "<group_id>-<host>-<random>)")


def required(settings, transactional: bool) -> list[Permission]:
    """Every permission the worker needs with these settings."""
    out: list[Permission] = []
    if settings.source.type == "kafka":
        for topic in _topics(settings.source.topic):
            out.append(Permission("READ", "topic", topic, why="consume the input"))
        out.append(Permission("READ", "group", settings.kafka.group_id,
                              why="join the group, commit its offsets"))
    if settings.sink.type == "kafka":
        s = settings.sink
        outs = [(s.topic, "publish scores"), (s.dead_letter_topic, "publish dead letters")]
        if settings.model.shadow_path:
            outs.append((s.shadow_topic, "publish the shadow model's scores"))
        if settings.monitoring.topic:
            outs.append((settings.monitoring.topic, "publish flight monitoring's windows"))
        for topic, why in outs:
            out.append(Permission("WRITE", "topic", topic, why=why))
        for topic, _why in outs:
            out.append(Permission("DESCRIBE_CONFIGS", "topic", topic,
                                  why="read max.message.bytes (outputs kept under it)"))
        if transactional:
            out.append(transactional_id_permission(settings))
    return out


def _topics(spec: str | None) -> list[str]:
    return [t.strip() for t in (spec or "").split(",") if t.strip()]


def check_access(settings, transactional: bool, timeout_s: float = 30.0) -> None:
    """Authenticate, then compare what the brokers allow this principal on every topic and on
    the group with ``required``. Raises AuthenticationFailed or NotAuthorized (exit 1); a
    broker that does not answer within ``timeout_s`` is left to the clients (they say so)."""
    conf = settings.kafka.common()
    needs = [p for p in required(settings, transactional) if p.resource in ("topic", "group")]
    if not needs:
        return
    unknown: list[Permission] = []
    absent: list[str] = []
    missing = missing_permissions(conf, needs, timeout_s, unknown=unknown, absent=absent,
                                  connect_timeout_s=settings.kafka.connect_timeout_s)
    if missing:
        raise NotAuthorized(missing, principal_of(conf))
    if absent:
        named = _topic_settings(settings)
        log.warning("kafka topic does not exist: create it first (the worker creates no "
                    "topic; a broker with auto.create.topics.enable makes it on first use "
                    "with its defaults)",
                    topics=[f"{t} ({named[t]})" if t in named else t for t in absent])
        unknown = [p for p in unknown if not (p.resource == "topic" and p.name in absent)]
    checked = [str(p) for p in needs if p not in unknown and p.name not in absent]
    if unknown:  # no answer in time, or brokers that do not report authorized operations
        log.warning("kafka access not verified (the brokers did not say): a refusal will "
                    "stop the worker when it comes", principal=principal_of(conf),
                    not_verified=[str(p) for p in unknown], verified=checked)
    else:
        log.info("kafka access checked", principal=principal_of(conf), permissions=checked)


def _topic_settings(settings) -> dict[str, str]:
    """The setting that names each topic the worker uses."""
    out: dict[str, str] = {}  # topic -> setting
    if settings.source.type == "kafka":
        for t in settings.source.topic.split(","):
            if t.strip():
                out.setdefault(t.strip(), "source.topic")
    if settings.sink.type == "kafka":
        for key in ("topic", "dead_letter_topic", "shadow_topic"):
            t = getattr(settings.sink, key, None)
            if t:
                out.setdefault(t, f"sink.{key}")
    if getattr(settings.monitoring, "topic", None):
        out.setdefault(settings.monitoring.topic, "monitoring.topic")
    return out


class BrokersUnreachable(StartupError):
    """No broker of bootstrap.servers answered within kafka.connect_timeout_s (exit 1)."""

    def __init__(self, bootstrap: str, waited_s: float, why: str | None):
        addresses = ", ".join(a.strip() for a in bootstrap.split(",") if a.strip())
        super().__init__("kafka", f"no Kafka broker answered at {addresses} within "
                                  f"{waited_s:g} s (kafka.connect_timeout_s)"
                                  + (f": {why}" if why else ""), exit_code=1)


class AdvertisedUnreachable(StartupError):
    """A bootstrap address answered, but none of the addresses the brokers advertise (where
    every later request goes) takes a connection: advertised.listeners names what this
    worker cannot reach (exit 1)."""

    def __init__(self, bootstrap: str, advertised: list[str], why: str):
        super().__init__("kafka", f"the brokers at {bootstrap} answered, but none of the "
                                  f"addresses they advertise takes a connection from here "
                                  f"({', '.join(advertised)}: {why}); check the brokers' "
                                  "advertised.listeners", exit_code=1)


def missing_permissions(client_conf: dict, needs: list[Permission], timeout_s: float = 30.0,
                        unknown: list | None = None, absent: list | None = None,
                        connect_timeout_s: float | None = None) -> list[Permission]:
    """Which of ``needs`` (topics and groups) the brokers deny this client's principal, asked
    with an admin client of its own; ``unknown`` collects those the brokers did not judge (no
    answer in time, an absent topic, no authorized operations), ``absent`` the topics the
    brokers say do not exist. With ``connect_timeout_s``, first waits that long for any
    broker to answer, then raises BrokersUnreachable naming them. Raises
    AuthenticationFailed (or StartupError for a setting librdkafka refuses)."""
    unknown = [] if unknown is None else unknown
    absent = [] if absent is None else absent
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient

    principal = principal_of(client_conf)
    refused: list[KafkaError] = []
    trouble: list[KafkaError] = []  # the last transport error: why no broker answers

    def on_error(err: KafkaError) -> None:
        if err.code() in AUTHENTICATION_ERRORS:
            refused.append(err)
        elif err.code() != KafkaError._ALL_BROKERS_DOWN or not trouble:
            trouble[:] = [err]  # (why a broker is down says more than "all are down")

    conf = admin_config(client_conf)
    conf["error_cb"] = on_error
    try:
        admin = AdminClient(conf)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        raise StartupError("kafka", err.str() if isinstance(err, KafkaError) else str(exc)) \
            from None
    if connect_timeout_s is not None:
        _wait_for_a_broker(admin, client_conf.get("bootstrap.servers", ""), connect_timeout_s,
                           refused, trouble, principal)
    deadline = time.monotonic() + timeout_s

    told = []

    def wait(futures: dict) -> dict:
        """Each future's result or its error, serving error_cb (poll) while waiting."""
        t0 = time.monotonic()
        while not all(f.done() for f in futures.values()):
            admin.poll(0.1)
            if refused:
                raise AuthenticationFailed(refused[0].str(), principal)
            if not told and time.monotonic() - t0 > 1.0:
                told.append(True)
                log.info("waiting for the brokers to answer the access check",
                         gives_up_in_s=round(deadline - time.monotonic()))
            if time.monotonic() > deadline:
                return {}
        out = {}
        for key, fut in futures.items():
            try:
                out[key] = fut.result()
            except KafkaException as exc:
                out[key] = exc.args[0] if exc.args else exc
        return out

    missing: list[Permission] = []
    topics = sorted({p.name for p in needs if p.resource == "topic"})
    allowed: dict[str, set[str]] = {}
    hidden: set[str] = set()  # no Describe: neither Read nor Write (they imply it)
    while topics and time.monotonic() < deadline:
        results = wait(admin.describe_topics(TopicCollection(topics), request_timeout=10,
                                             include_authorized_operations=True))
        again = []
        for topic, res in results.items():
            if isinstance(res, KafkaError):
                if res.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    hidden.add(topic)
                elif res.code() in _TRANSIENT:
                    again.append(topic)
                elif res.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    absent.append(topic)  # nothing to judge: said as absent
            elif res.authorized_operations is not None:
                allowed[topic] = {op.name for op in res.authorized_operations}
        topics = again
        if again:
            time.sleep(0.5)
    group = [p for p in needs if p.resource == "group"]
    judged_group = False
    if group and time.monotonic() < deadline:
        # asked in a process of its own: librdkafka aborts (SIGABRT, its issue #4605) when a
        # group's coordinator answers after a describe of it timed out; the worker then died
        # with no line (issue 53). A helper that dies is a check not made, said, not a crash
        verdict = describe_group_apart(conf, group[0].name, deadline - time.monotonic())
        if verdict == "denied":
            missing.append(group[0])
            judged_group = True
        elif verdict == "allowed":
            judged_group = True
        elif verdict.startswith("auth:"):
            raise AuthenticationFailed(verdict[5:], principal)
    if group and not judged_group:
        unknown.append(group[0])
    for p in needs:
        if p.resource != "topic":
            continue
        ops = allowed.get(p.name)
        denied = ops is not None and p.operation not in ops and "ALL" not in ops
        if denied or (p.name in hidden and p.operation in ("READ", "WRITE")):
            missing.append(p)
        elif ops is None:  # no answer, an absent topic, DescribeConfigs behind no Describe
            unknown.append(p)
    missing.sort(key=lambda p: (p.resource != "topic", p.operation != "READ"))
    return missing


def _wait_for_a_broker(admin, bootstrap: str, timeout_s: float, refused: list, trouble: list,
                       principal: str) -> None:
    """Until one broker answers a metadata request (the client then knows the cluster), at
    most ``timeout_s``; BrokersUnreachable after that, with librdkafka's last word on why
    (connection refused, a name that does not resolve, a TLS handshake that failed)."""
    t0 = time.monotonic()
    told = False
    while True:
        left = timeout_s - (time.monotonic() - t0)
        try:
            md = admin.list_topics(timeout=max(0.1, min(1.0, left)))
            _reach_advertised(md, bootstrap, t0 + timeout_s)
            return
        except KafkaException:
            pass
        admin.poll(0)  # (serves error_cb)
        if refused:
            raise AuthenticationFailed(refused[0].str(), principal)
        if time.monotonic() - t0 >= timeout_s:
            raise BrokersUnreachable(bootstrap, timeout_s,
                                     trouble[0].str() if trouble else "no answer")
        if not told and time.monotonic() - t0 > 2.0:
            told = True
            log.warning("waiting for the brokers to answer", bootstrap_servers=bootstrap,
                        error=trouble[0].str() if trouble else None,
                        gives_up_in_s=round(timeout_s - (time.monotonic() - t0)))


def _reach_advertised(md, bootstrap: str, deadline: float) -> None:
    """One of the addresses the brokers advertise takes a TCP connection (the classic
    container mistake: a bootstrap address that works, advertised.listeners naming a host or
    port only the brokers' own network reaches, and a worker that then waits for ever)."""
    import socket

    advertised = sorted({(b.host, b.port) for b in md.brokers.values()})
    if not advertised:
        return
    why = "no answer"
    for host, port in advertised:
        try:
            with socket.create_connection((host, port),
                                          timeout=max(0.2, min(3.0, deadline - time.monotonic()))):
                return
        except OSError as exc:
            why = exc.strerror or str(exc) or type(exc).__name__
    raise AdvertisedUnreachable(bootstrap, [f"{h}:{p}" for h, p in advertised], why)


def describe_group_apart(conf: dict, group: str, timeout_s: float) -> str:
    """Whether this client may READ ``group``, asked by a child process
    (``python -m worker.io.access``): "allowed", "denied", "unknown" (no answer in time, no
    authorized operations, the helper died: it is logged) or "auth:<why>" (authentication
    refused)."""
    import json
    import subprocess
    import sys

    plain = {k: v for k, v in conf.items() if isinstance(v, (str, int, float, bool))}
    request = json.dumps({"conf": plain, "group": group, "timeout_s": max(timeout_s, 1.0)})
    try:
        proc = subprocess.run([sys.executable, "-m", "worker.io.access"], input=request,
                              capture_output=True, text=True, timeout=timeout_s + 15)
    except subprocess.TimeoutExpired:
        log.warning("the consumer group's access check did not finish", group=group)
        return "unknown"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        # (a signal: librdkafka's abort; the worker goes on without the check)
        log.warning("the consumer group's access check failed in its helper process: "
                    "not verified", group=group, exit=proc.returncode,
                    error=(proc.stderr.strip().splitlines() or [""])[-1][:300])
        return "unknown"
    return lines[-1]


def _describe_group(conf: dict, group: str, timeout_s: float) -> str:
    """The child's side of ``describe_group_apart``."""
    from confluent_kafka.admin import AdminClient

    refused: list[KafkaError] = []
    conf = dict(conf)
    conf["error_cb"] = lambda err: refused.append(err) if err.code() in \
        AUTHENTICATION_ERRORS else None
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        futures = admin.describe_consumer_groups([group], request_timeout=10,
                                                 include_authorized_operations=True)
        fut = futures[group]
        while not fut.done() and time.monotonic() < deadline:
            admin.poll(0.1)
            if refused:
                return "auth:" + refused[0].str()
        if not fut.done():
            break
        try:
            res = fut.result()
        except KafkaException as exc:
            res = exc.args[0] if exc.args else exc
        if isinstance(res, KafkaError):
            if res.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                return "denied"
            if res.code() in _TRANSIENT:
                time.sleep(0.5)
                continue
            return "unknown"
        if res.authorized_operations is None:
            return "unknown"
        return "allowed" if "READ" in {op.name for op in res.authorized_operations} \
            else "denied"
    return "unknown"


def principal_of(conf: dict) -> str:
    """Who the brokers see, as far as a client configuration tells (for messages)."""
    protocol = str(conf.get("security.protocol", "PLAINTEXT")).upper()
    if protocol.startswith("SASL_"):
        user = conf.get("sasl.username")
        return f"User:{user}" if user else f"this worker ({conf.get('sasl.mechanism', 'SASL')})"
    if protocol == "SSL" and conf.get("ssl.certificate.location"):
        subject = _subject(conf["ssl.certificate.location"])
        return f"User:{subject}" if subject else \
            f"the subject of {conf['ssl.certificate.location']}"
    return "User:ANONYMOUS"


def refusal(err, principal: str, *, topic: str | None = None, group: str | None = None,
            transactional_id: str | Permission | None = None,
            topic_operation: str = "READ") -> NotAuthorized | None:
    """A broker's refusal met while running, as NotAuthorized naming the permission (None if
    ``err`` is not an authorization error)."""
    if not isinstance(err, KafkaError) or err.code() not in AUTHORIZATION_ERRORS:
        return None
    kind = AUTHORIZATION_ERRORS[err.code()]
    if kind == "topic":
        perm = Permission(topic_operation, "topic", topic or "(the topic named in the error)")
    elif kind == "group":
        perm = Permission("READ", "group", group or "(the consumer group)")
    elif kind == "transactional-id":
        perm = transactional_id if isinstance(transactional_id, Permission) else \
            Permission("WRITE", "transactional-id", transactional_id or "(this worker's)")
    else:
        perm = Permission("IDEMPOTENT_WRITE", "cluster", "kafka-cluster")
    return NotAuthorized(perm, principal, err.str())


def _subject(path: str) -> str | None:
    """A PEM certificate's subject as Kafka names it by default ("CN=worker,O=..."; the
    brokers' ssl.principal.mapping.rules may shorten it), or None if it cannot be read."""
    import ssl

    try:
        decoded = ssl._ssl._test_decode_cert(path)  # the stdlib's PEM reader (no dependency)
    except Exception:  # noqa: BLE001 (an encrypted bundle, a key first: name the file instead)
        return None
    names = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
             "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST"}
    parts = [f"{names.get(k, k)}={v}" for rdn in decoded.get("subject", ()) for k, v in rdn]
    return ",".join(reversed(parts)) or None


if __name__ == "__main__":  # describe_group_apart's helper: a JSON request on stdin
    import json
    import os
    import sys

    req = json.loads(sys.stdin.read())
    print(_describe_group(req["conf"], req["group"], float(req["timeout_s"])), flush=True)
    os._exit(0)  # the admin client is not destroyed: its pending requests die with us
