"""Frozen, validated configuration: YAML file, then SCORING_WORKER__SECTION__KEY overrides.

The environment is read here and nowhere else. ``kafka_client_config`` renders the librdkafka
dictionaries the Kafka layer hands to confluent-kafka.
"""

from __future__ import annotations

import math
import os
import re
import socket
import uuid
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "SCORING_WORKER__"


class ConfigError(ValueError):
    """A bad configuration; the message names the field."""


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last,
    so a second ``scoring:`` section silently replaced the first and its decision bands
    (a hostile review). Merge keys (``<<``) still merge."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self._once_each(node)
        return super().construct_mapping(node, deep=deep)

    def _once_each(self, node) -> None:
        """ConstructorError for a key given twice in ``node``, or in a mapping merged into it
        inline (``<<: {...}``, which PyYAML flattens without constructing), or for two merge
        keys."""
        seen, merges = set(), 0
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                merges += 1
                if merges > 1:
                    raise yaml.constructor.ConstructorError(
                        None, None, "the merge key '<<' is given twice in one mapping (merge "
                        "a list: <<: [*a, *b])", key_node.start_mark)
                merged = value_node.value if isinstance(value_node, yaml.SequenceNode) \
                    else [value_node]
                for sub in merged:
                    if isinstance(sub, yaml.MappingNode):
                        self._once_each(sub)
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                again = key in seen
                seen.add(key)
            except TypeError:  # (an unhashable key: the constructor says so)
                continue
            if again:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {str(key)[:80]!r} is given twice in one mapping "
                    "(the second would replace the first)", key_node.start_mark)


def _numbers_only(annotation) -> bool:
    """The annotation takes numbers (int, float, or one of them or None), not booleans."""
    import types
    import typing

    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = set(typing.get_args(annotation)) - {type(None)}
        return bool(args) and args <= {int, float}
    if typing.get_origin(annotation) is list:
        return set(typing.get_args(annotation)) <= {int, float}
    return False


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, v, info):
        """A number's setting takes a number: YAML's true/false is not 1/0, and a quoted
        number in a list is not a number (a hostile review: ``threads: true`` ran one
        thread, ``thresholds: ["0.5"]`` was read as 0.5). Scalars from the environment are
        text and are converted as before."""
        field = cls.model_fields.get(info.field_name)
        if field is None or not _numbers_only(field.annotation):
            return v
        values = v if isinstance(v, list) else [v]
        if any(isinstance(x, bool) for x in values):
            raise ValueError("a number, not true or false")
        if isinstance(v, list) and any(isinstance(x, str) for x in values):
            raise ValueError("numbers, not quoted text")
        return v


class FieldSpec(_Section):
    """One feature's (or the id's) place in a JSON or Avro event and how its value is read."""

    path: str | None = None
    """The dotted path of keys or record fields (default: the top-level field of its name)."""
    optional: bool = False
    """An event without the field (Avro: a writer schema without it) is a missing value,
    counted in scoring_feature_absent; by default such an event is dead-lettered
    (missing_field; Avro: schema_mismatch)."""
    cast: Literal["number", "string"] | None = None
    """number: a string holding a JSON number is read as that number (e.g. "12.30");
    string: an integer is read as its decimal digits, a category of the model's (e.g. a
    merchant category code 7995 for the category "7995"). Without a cast such values are
    bad_type."""


class SourceConfig(_Section):
    type: Literal["kafka", "file"] = "file"
    """Where input messages come from: a Kafka topic, or a recorded topic file."""
    topic: str | None = None
    """Kafka: topic to consume (comma-separated for several)."""
    path: str | None = None
    """File: recorded topic (.arrows), or for JSON events JSON lines (.jsonl: one message a
    line)."""
    format: Literal["arrow", "json", "avro"] = "arrow"
    """The messages' format: an Arrow IPC stream, JSON (one event, an object, or an array
    of events), or Avro in Confluent's wire format (one record)."""
    fields: dict[str, str | FieldSpec] = {}
    """JSON and Avro: where a feature (or the id column) is in an event, as a dotted path of
    keys or record fields ({"amount": "txn.amount"}), or as {path, optional, cast}; the
    default is the top-level field of its name, required. A required feature absent from an
    event dead-letters it (missing_field)."""
    schemas_dir: str | None = None
    """Avro: a folder of writer schemas, <schema id>.avsc."""

    @model_validator(mode="after")
    def _needs(self):
        if self.format == "avro" and not self.schemas_dir:
            raise ValueError("source.format avro needs source.schemas_dir (a folder of "
                             "<schema id>.avsc writer schemas)")
        if self.format == "avro":
            try:
                import fastavro  # noqa: F401 (the schemas' parser)
            except ImportError:
                raise ValueError("source.format avro needs fastavro: pip install "
                                 "'scoring-worker[avro]'") from None
        if self.schemas_dir and not Path(self.schemas_dir).is_dir():
            raise ValueError(f"source.schemas_dir: {self.schemas_dir} is not a folder")
        for name, spec in self.fields.items():
            path = spec if isinstance(spec, str) else spec.path
            if path is None:
                continue  # its own name, one key
            if not path or any(not key for key in path.split(".")):
                raise ValueError(f"source.fields.{name}: {path!r} is not a dotted path of "
                                 "keys")
        if self.fields and self.format == "arrow":
            raise ValueError("source.fields maps JSON and Avro events: set source.format")
        if self.type == "kafka" and not self.topic:
            raise ValueError("source.topic is required when source.type is kafka")
        if self.type == "file" and not self.path:
            raise ValueError("source.path is required when source.type is file")
        if self.type == "file" and Path(self.path).suffix in (".jsonl", ".ndjson") and \
                self.format != "json":
            raise ValueError(f"source.path: {self.path} holds JSON lines: set source.format "
                             "to json")
        return self


class SinkConfig(_Section):
    type: Literal["kafka", "file"] = "file"
    """Where scores go: a Kafka topic, or a recorded topic file."""
    topic: str | None = None
    """Kafka: output topic, one Arrow IPC stream per input message."""
    dead_letter_topic: str | None = None
    """Kafka: topic for undecodable or invalid input (default <topic>-dlq)."""
    path: str | None = None
    """File: scores as a recorded topic (.arrows)."""
    dead_letter_path: str | None = None
    """File: dead letters (default <path stem>-dlq.arrows)."""
    shadow_topic: str | None = None
    """Kafka: the shadow model's scores (default <topic>-shadow when model.shadow_path is set)."""
    shadow_path: str | None = None
    """File: the shadow model's scores (default <path stem>-shadow.arrows)."""
    format: Literal["arrow", "json"] = "arrow"
    """The scores' format: an Arrow IPC stream a message, or JSON (an object for a message
    that was one JSON event, else an array of objects)."""

    @model_validator(mode="before")
    @classmethod
    def _default_dead_letters(cls, data):
        """Dead letters go beside the scores unless named: <topic>-dlq, <path stem>-dlq."""
        if isinstance(data, dict):
            data = dict(data)
            if data.get("topic") and not data.get("dead_letter_topic"):
                data["dead_letter_topic"] = f"{data['topic']}-dlq"
            if data.get("path") and not data.get("dead_letter_path"):
                p = Path(data["path"])
                data["dead_letter_path"] = str(p.with_name(p.stem + "-dlq" + p.suffix))
            if data.get("topic") and not data.get("shadow_topic"):
                data["shadow_topic"] = f"{data['topic']}-shadow"
            if data.get("path") and not data.get("shadow_path"):
                p = Path(data["path"])
                data["shadow_path"] = str(p.with_name(p.stem + "-shadow" + p.suffix))
        return data

    @model_validator(mode="after")
    def _needs(self):
        if self.type == "kafka" and not self.topic:
            raise ValueError("sink.topic is required when sink.type is kafka")
        if self.type == "file" and not self.path:
            raise ValueError("sink.path is required when sink.type is file")
        return self


# librdkafka settings the worker owns: exactly-once and at-least-once depend on them (or they
# have a field of their own here), so kafka.client may not set them.
RESERVED_CLIENT_KEYS = {
    "isolation.level": "read_committed is what exactly-once readers rely on",
    "enable.auto.commit": "offsets are committed by the worker, after delivery",
    "auto.commit.enable": "offsets are committed by the worker, after delivery",
    "enable.auto.offset.store": "offsets are stored by the worker, after delivery",
    "offset.store.method": "offsets are stored by the worker, after delivery",
    "enable.idempotence": "the producer must be idempotent",
    "acks": "the idempotent producer needs acks=all",
    "request.required.acks": "the idempotent producer needs acks=all",
    "transactional.id": "set kafka.transactional_id",
    "transaction.timeout.ms": "set delivery.transaction_timeout_ms",
    "group.id": "set kafka.group_id",
    "bootstrap.servers": "set kafka.bootstrap_servers",
    "metadata.broker.list": "set kafka.bootstrap_servers",
    # security: one place, validated together (a client key would override it silently)
    "security.protocol": "set kafka.security_protocol",
    "sasl.mechanism": "set kafka.sasl_mechanism",
    "sasl.mechanisms": "set kafka.sasl_mechanism",
    "ssl.endpoint.identification.algorithm": "set kafka.ssl_endpoint_identification",
    "enable.ssl.certificate.verification": "the brokers' certificates are always verified "
                                           "(set kafka.ssl_ca_location to their CA)",
    "ssl.ca.location": "set kafka.ssl_ca_location",
    "ssl.certificate.location": "set kafka.ssl_certificate_location",
    "ssl.key.location": "set kafka.ssl_key_location",
    "sasl.username": "set kafka.sasl_username",
    "sasl.oauthbearer.method": "set kafka.sasl_oauthbearer_method",
    "sasl.oauthbearer.client.id": "set kafka.sasl_oauthbearer_client_id",
    "sasl.oauthbearer.token.endpoint.url": "set kafka.sasl_oauthbearer_token_endpoint_url",
    "sasl.oauthbearer.scope": "set kafka.sasl_oauthbearer_scope",
    "sasl.oauthbearer.extensions": "set kafka.sasl_oauthbearer_extensions",
}
SECRET_CLIENT_KEYS = {"sasl.password", "ssl.key.password", "ssl.keystore.password",
                      "sasl.oauthbearer.client.secret", "ssl.key.pem", "ssl_key.pem",
                      "sasl.oauthbearer.config"}


def is_secret_key(key) -> bool:
    """A librdkafka setting whose value is a secret (librdkafka's own sensitive settings, and
    any key naming a password or a secret)."""
    k = str(key).strip().lower()
    return k in SECRET_CLIENT_KEYS or "password" in k or "secret" in k
# the fields that hold a secret, each with the field that names a file holding it instead
SECRET_FIELDS = {"sasl_password": "sasl_password_file",
                 "ssl_key_password": "ssl_key_password_file",
                 "sasl_oauthbearer_client_secret": "sasl_oauthbearer_client_secret_file"}
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")


def read_secret_file(path: str) -> str:
    """A secret mounted as a file (a Kubernetes Secret volume): its text, less one trailing
    newline. Raises OSError or UnicodeDecodeError."""
    text = Path(path).read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


class KafkaConfig(_Section):
    bootstrap_servers: str = "127.0.0.1:9092"
    """Comma-separated host:port list."""
    group_id: str = "scoring-worker"
    """Consumer group; workers with the same group share the partitions."""
    transactional_id: str | None = None
    """Exactly-once producer id (default <group_id>-<host>-<random>)."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    """PLAINTEXT, SSL (TLS; mutual TLS with ssl_certificate_location), SASL_PLAINTEXT or
    SASL_SSL (default: PLAINTEXT)."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER",
                            "GSSAPI"] | None = None
    """PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or GSSAPI (with a SASL protocol)."""
    sasl_username: str | None = None
    """SASL user name (PLAIN, SCRAM)."""
    sasl_password: SecretStr | None = None
    """SASL password: from the environment (SCORING_WORKER__KAFKA__SASL_PASSWORD) or
    sasl_password_file, never in the config file."""
    sasl_password_file: str | None = None
    """A file holding the SASL password (a mounted Secret); one trailing newline is dropped."""
    sasl_oauthbearer_method: Literal["default", "oidc"] | None = None
    """OAUTHBEARER: oidc fetches tokens from sasl_oauthbearer_token_endpoint_url with the
    client id and secret (client credentials grant)."""
    sasl_oauthbearer_client_id: str | None = None
    """OAUTHBEARER oidc: the client id."""
    sasl_oauthbearer_client_secret: SecretStr | None = None
    """OAUTHBEARER oidc: the client secret (from the environment or ..._secret_file)."""
    sasl_oauthbearer_client_secret_file: str | None = None
    """OAUTHBEARER oidc: a file holding the client secret."""
    sasl_oauthbearer_token_endpoint_url: str | None = None
    """OAUTHBEARER oidc: the identity provider's token endpoint."""
    sasl_oauthbearer_scope: str | None = None
    """OAUTHBEARER oidc: the scope asked for (optional)."""
    sasl_oauthbearer_extensions: str | None = None
    """OAUTHBEARER oidc: SASL extensions, key=value pairs separated by commas (optional)."""
    ssl_ca_location: str | None = None
    """CA certificate file (PEM) that signed the brokers' certificates (default: the system's)."""
    ssl_certificate_location: str | None = None
    """Mutual TLS: this worker's certificate (PEM)."""
    ssl_key_location: str | None = None
    """Mutual TLS: this worker's private key (PEM)."""
    ssl_key_password: SecretStr | None = None
    """The private key's password (from the environment or ssl_key_password_file)."""
    ssl_key_password_file: str | None = None
    """A file holding the private key's password."""
    ssl_endpoint_identification: bool = True
    """Check that a broker's certificate names the host connected to (off only for a test)."""
    connect_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Start-up: how long to wait for any broker to answer; then exit 1 naming the addresses
    tried and why they did not answer."""
    client: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Any librdkafka setting, passed through to consumer and producer (except those the
    delivery guarantees depend on)."""
    allow_secrets_in_file: bool = False
    """Accept a password written in the config file (default: only from the environment or
    a *_file field)."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _addresses(cls, v: str) -> str:
        entries = [e.strip() for e in v.split(",") if e.strip()]
        if not entries:
            raise ValueError("names no broker: give host:port[,host:port...]")
        for e in entries:
            m = re.search(r"(?:^[^:\[\]]+|\]):(\d+)$", e)  # host:port, [v6]:port
            if m and not 0 < int(m.group(1)) <= 65535:
                raise ValueError(f"{e!r}: port {m.group(1)} is not 1..65535")
        return v

    @field_validator("client")
    @classmethod
    def _not_reserved(cls, v: dict) -> dict:
        for key in v:
            why = RESERVED_CLIENT_KEYS.get(key.strip().lower())
            if why:
                raise ValueError(f"{key!r} cannot be set here: {why}")
        return v

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, v):
        return v.strip().upper() if isinstance(v, str) else v

    @field_validator("ssl_ca_location", "ssl_certificate_location", "ssl_key_location",
                     "sasl_password_file", "ssl_key_password_file",
                     "sasl_oauthbearer_client_secret_file")
    @classmethod
    def _readable(cls, v: str | None) -> str | None:
        if v is not None and not os.access(v, os.R_OK):
            raise ValueError(f"{v} does not exist or cannot be read")
        if v is not None and not os.path.isfile(v):
            raise ValueError(f"{v} is not a file")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        protocol = self.security_protocol or "PLAINTEXT"
        for secret, file in SECRET_FIELDS.items():
            if getattr(self, secret) is not None and getattr(self, file) is not None:
                raise ValueError(f"kafka.{secret} and kafka.{file} are both set: set one")
        sasl = protocol in SASL_PROTOCOLS
        if self.sasl_mechanism and not sasl:
            raise ValueError(f"kafka.sasl_mechanism is {self.sasl_mechanism} but "
                             f"kafka.security_protocol is {protocol}: use SASL_SSL")
        if sasl:
            mechanism = self.sasl_mechanism or "GSSAPI"
            if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
                if not self.sasl_username:
                    raise ValueError(f"kafka.sasl_username is required for {mechanism}")
                if self.sasl_password is None and self.sasl_password_file is None and \
                        "sasl.password" not in self.client:
                    raise ValueError(f"kafka.sasl_password is required for {mechanism}: set "
                                     f"{ENV_PREFIX}KAFKA__SASL_PASSWORD or "
                                     "kafka.sasl_password_file")
            if mechanism == "OAUTHBEARER" and self.sasl_oauthbearer_method != "oidc" and \
                    not self.client.get("enable.sasl.oauthbearer.unsecure.jwt"):
                raise ValueError("kafka.sasl_oauthbearer_method: OAUTHBEARER needs a token "
                                 "source: set it to oidc (with the client id, secret and token "
                                 "endpoint), or kafka.client.enable.sasl.oauthbearer.unsecure."
                                 "jwt: true for a test broker")
            if mechanism == "OAUTHBEARER" and self.sasl_oauthbearer_method == "oidc":
                for need in ("sasl_oauthbearer_client_id",
                             "sasl_oauthbearer_token_endpoint_url"):
                    if not getattr(self, need):
                        raise ValueError(f"kafka.{need} is required for OAUTHBEARER oidc")
                if self.sasl_oauthbearer_client_secret is None and \
                        self.sasl_oauthbearer_client_secret_file is None:
                    raise ValueError("kafka.sasl_oauthbearer_client_secret is required for "
                                     "OAUTHBEARER oidc (or ..._secret_file)")
        oauth = [f for f in type(self).model_fields if f.startswith("sasl_oauthbearer_")
                 and getattr(self, f) is not None]
        if oauth and self.sasl_mechanism != "OAUTHBEARER":
            raise ValueError(f"kafka.{oauth[0]} is set but kafka.sasl_mechanism is not "
                             "OAUTHBEARER")
        tls = [f for f in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location",
                           "ssl_key_password", "ssl_key_password_file")
               if getattr(self, f) is not None]
        if tls and protocol not in TLS_PROTOCOLS:
            raise ValueError(f"kafka.{tls[0]} is set but kafka.security_protocol is "
                             f"{protocol} (no TLS): use SSL or SASL_SSL")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("kafka.ssl_certificate_location and kafka.ssl_key_location go "
                             "together (mutual TLS)")
        return self

    def _secret(self, name: str) -> str | None:
        value, file = getattr(self, name), getattr(self, SECRET_FIELDS[name])
        if value is not None:
            return value.get_secret_value()
        if file is not None:
            try:
                return read_secret_file(file)
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"config error: kafka.{SECRET_FIELDS[name]}: cannot read "
                                  f"{file}: {exc.__class__.__name__}") from None
        return None

    def common(self) -> dict[str, Any]:
        """The settings every Kafka client of the worker shares: brokers, security, and
        kafka.client (secrets resolved here, from the environment or their files)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        for key, value in (("security.protocol", self.security_protocol),
                           ("sasl.mechanism", self.sasl_mechanism),
                           ("sasl.username", self.sasl_username),
                           ("sasl.password", self._secret("sasl_password")),
                           ("sasl.oauthbearer.method", self.sasl_oauthbearer_method),
                           ("sasl.oauthbearer.client.id", self.sasl_oauthbearer_client_id),
                           ("sasl.oauthbearer.client.secret",
                            self._secret("sasl_oauthbearer_client_secret")),
                           ("sasl.oauthbearer.token.endpoint.url",
                            self.sasl_oauthbearer_token_endpoint_url),
                           ("sasl.oauthbearer.scope", self.sasl_oauthbearer_scope),
                           ("sasl.oauthbearer.extensions", self.sasl_oauthbearer_extensions),
                           ("ssl.ca.location", self.ssl_ca_location),
                           ("ssl.certificate.location", self.ssl_certificate_location),
                           ("ssl.key.location", self.ssl_key_location),
                           ("ssl.key.password", self._secret("ssl_key_password"))):
            if value is not None:
                conf[key] = value
        if (self.security_protocol or "PLAINTEXT") in TLS_PROTOCOLS:
            conf["ssl.endpoint.identification.algorithm"] = (
                "https" if self.ssl_endpoint_identification else "none")
        conf.update(self.client)
        from .kafkalog import kafka_logger

        conf["logger"] = kafka_logger()  # librdkafka's lines through the worker's log
        return conf

    def warnings(self) -> list[str]:
        """Settings that work but expose something (logged at start-up)."""
        out = []
        if self.security_protocol == "SASL_PLAINTEXT" and self.sasl_mechanism == "PLAIN":
            out.append("SASL PLAIN without TLS (SASL_PLAINTEXT) sends the password in clear "
                       "text: use SASL_SSL")
        return out

    def masked(self) -> dict[str, Any]:
        """This section for a log line: every secret shown as '***'."""
        out = {k: v for k, v in self.model_dump(mode="json").items() if v is not None}
        for secret in SECRET_FIELDS:
            if secret in out:
                out[secret] = "***"
        out["client"] = {k: ("***" if is_secret_key(k) else v) for k, v in self.client.items()}
        return out


class ModelConfig(_Section):
    path: str
    """Compiled model artifact (`scoring-worker compile`); required."""
    reload: bool = False
    """Watch `path`: a new artifact is verified and swapped in between two batches."""
    reload_interval_ms: int = Field(1000, ge=50, le=600_000)
    """How often `path` is checked for a new artifact."""
    allow_feature_change: bool = False
    """Accept a new artifact that reads features the running model does not."""
    shadow_path: str | None = None
    """A challenger scored on the same rows; its scores go to sink.shadow_topic/shadow_path
    in the same transaction (watched like `path` when `reload` is on)."""


class LazyConfig(BaseModel):
    # extra keys are the policy parameters
    model_config = ConfigDict(frozen=True, extra="allow", use_attribute_docstrings=True)
    mode: Literal["off", "certified", "lazyrf", "lazygbm"] = "off"
    """Early-stopping policy; other keys of this section are its parameters."""

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v):
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ExplainConfig(_Section):
    """Reason codes: the top features behind the score of each flagged row."""

    method: Literal["treeshap", "path"] = "treeshap"
    """treeshap: exact path-dependent TreeSHAP; path: the cheaper Saabas path attribution."""
    top_k: int = Field(3, ge=1, le=64)
    """Features named per explained row, by absolute attribution."""
    min_score: float | None = None
    """Rows with a score at or above this are explained (default: the lowest threshold)."""


class ScoringConfig(_Section):
    id_column: str | None = Field("txn_id", min_length=1)
    """Input column passed through as `id` (none: the row index in the message)."""
    threads: int | None = Field(None, ge=1, le=256)
    """Kernel threads (default: all cores)."""
    thresholds: list[float] = Field(default_factory=lambda: [0.5])
    """Decision thresholds on the score, strictly increasing, 1 to 127 of them (a decision is
    an 8-bit band index); decision = how many the score is >= to. For a model whose scores are
    probabilities, each within 0 to 1 (else exit 2)."""
    lazy: LazyConfig = Field(default_factory=LazyConfig)
    audit_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """Fraction of rows also fully evaluated; disagreements are exported as a metric."""
    explain: ExplainConfig | None = None
    """Reason codes for flagged rows (output columns reason_feature, reason_value,
    reason_bias); unset: none."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data):
        if isinstance(data, dict) and "block_size" in data:
            import warnings

            data = {k: v for k, v in data.items() if k != "block_size"}
            warnings.warn("scoring.block_size is ignored and will be refused in the next "
                          "release (the kernels stage 64-row blocks)", FutureWarning,
                          stacklevel=2)
        return data

    @model_validator(mode="after")
    def _lazy_needs_a_policy(self):
        if self.lazy.mode == "off" and self.lazy.params:
            raise ValueError(f"scoring.lazy: parameters {sorted(self.lazy.params)} given with "
                             "mode off")
        if self.lazy.mode == "off" and self.audit_fraction:
            raise ValueError("scoring.audit_fraction: the audit compares a lazy policy with "
                             "full evaluation; set scoring.lazy.mode")
        return self

    @field_validator("thresholds")
    @classmethod
    def _sorted(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("at least one threshold is needed")
        if len(v) > 127:  # (model.result.MAX_THRESHOLDS)
            raise ValueError(f"{len(v)} thresholds, at most 127 (a decision is a band index "
                             "of 8 bits)")
        if not all(math.isfinite(t) for t in v):
            raise ValueError(f"thresholds must be finite numbers, got {v}")
        if any(b <= a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError("thresholds must be strictly increasing")
        return v


class DeliveryConfig(_Section):
    mode: Literal["exactly_once", "at_least_once"] = "exactly_once"
    """exactly_once: Kafka transactions (outputs and offsets commit together), Kafka to Kafka;
    a file run (recording to file) is exactly once as well, since each run writes its output
    whole. Kafka to file and file to Kafka are at least once (unset, the mode means that)."""
    max_message_rows: int = Field(1_000_000, ge=1)
    """A message of more rows is dead-lettered (`too_large`) instead of scored."""
    max_message_bytes: int | None = Field(None, ge=1024)
    """A message larger than this decoded (the columns read) is dead-lettered (`too_large`);
    default: an eighth of memory_budget_mb, at most a quarter of it."""
    memory_budget_mb: int = Field(1024, ge=256)
    """What the worker may hold: librdkafka's prefetch (1/16) and producer queue (1/8), one
    message (max_message_bytes, 1/8) and a batch are sized from it. Give the container
    about this much (peak RSS stays under it: tests/test_memory.py)."""
    max_batch_rows: int = Field(8192, ge=1)
    """A batch (one transaction) ends once it holds this many rows..."""
    max_batch_bytes: int = Field(16 << 20, ge=1024)
    """...or this many bytes (a message counts its input or decoded size, the larger; at most
    an eighth of memory_budget_mb)..."""
    max_batch_messages: int = Field(2000, ge=1)
    """...or this many messages..."""
    max_wait_ms: int = Field(20, ge=0, le=60_000)
    """...or this long after its first message."""
    transaction_timeout_ms: int = Field(60_000, ge=1000)
    """Broker-side transaction timeout."""
    overlap: bool = True
    """Kafka sink, behind a backlog: prepare the next batch while one commits."""
    stop_timeout_ms: int = Field(10_000, ge=0, le=600_000)
    """After SIGTERM/SIGINT, how long a commit waits for an unavailable broker before the
    worker aborts it and exits 0 (exit within this plus one batch)."""


class MetricsConfig(_Section):
    port: int = Field(0, ge=0, le=65535)
    """Prometheus /metrics and /healthz port; 0 turns the server off."""
    host: str = "127.0.0.1"
    """Bind address of the metrics server (loopback by default)."""


class HealthConfig(_Section):
    """When the worker says it is stalled (issue 53)."""
    stall_after_s: float = Field(30.0, gt=0, le=3600)
    """No batch completed for this long while input waits (a lag above 0, or partitions
    whose brokers do not answer): /readyz answers 503, one log line says what the worker
    waits on, and one more when it moves again."""


class MonitoringConfig(_Section):
    """Flight monitoring (issue 51): the scored rows and scores against the model's reference
    profile (`compile --reference`), counted in the scoring pass."""
    enabled: bool | None = None
    """false turns it off; otherwise on: against the artifact's reference profile where it
    has one, decision-band counts only where not (a warning at start-up if set true)."""
    window_s: float = Field(60.0, gt=0, le=86_400)
    """Seconds a window: PSI, missing and out-of-range rates are computed over each."""
    alert_psi: float = Field(0.25, gt=0, le=100)
    """A feature's or the score's PSI over a window at or above this logs a warning."""
    alert_missing_jump: float = Field(0.2, gt=0, le=1)
    """A feature's missing rate over a window this far above the reference's logs a
    warning."""
    min_rows: int = Field(100, ge=1, le=10_000_000)
    """Windows of fewer scored rows are counted but not judged (no PSI, no warning)."""
    topic: str | None = Field(None, min_length=1, max_length=249)
    """Kafka topic for one JSON record per judged window (its bounds, model id, counts per
    bin, the statistics); needs sink.type kafka (the same brokers and credentials)."""


class ServeConfig(_Section):
    """`scoring-worker serve` (its flags win over this section)."""

    host: str = "127.0.0.1"
    """Bind address (loopback by default; 0.0.0.0 in a container)."""
    port: int = Field(8080, ge=0, le=65535)
    """Port; 0 takes one the system picks (printed at start-up)."""
    name: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$")
    """The model's name in the URLs; default: the artifact's file stem."""
    grpc_port: int | None = Field(None, ge=0, le=65535)
    """The Open Inference Protocol's gRPC half (KServe v2) on this port too (0: one the system
    picks, printed at start-up); none by default. Not serve.port."""
    grpc_max_message_bytes: int = Field(4 << 20, ge=1024, le=1 << 31)
    """Largest gRPC request message (RESOURCE_EXHAUSTED beyond, before it is read whole);
    gRPC calls at once: serve.max_buffered_bytes / this. Send large batches over HTTP as
    binary tensors or Arrow."""
    workers: int = Field(1, ge=1, le=64)
    """Processes sharing the port (SO_REUSEPORT), each with its own copy of the model."""
    max_body_bytes: int = Field(64 << 20, ge=1024, le=1 << 31)
    """Largest request body; a larger one is answered 413 without being read."""
    max_buffered_bytes: int = Field(256 << 20, ge=1024, le=1 << 40)
    """Request bodies held at once, all connections together (503 beyond: memory stays
    bounded whatever the number of clients)."""
    max_json_bytes: int = Field(16 << 20, ge=1024, le=1 << 31)
    """Largest JSON request (its header, with binary tensors); a parsed JSON value takes
    tens of times its size: send large requests as binary tensors or Arrow (413 beyond)."""
    max_header_bytes: int = Field(16 << 10, ge=1024, le=1 << 20)
    """Largest request line plus headers (431 beyond)."""
    max_rows: int = Field(100_000, ge=1, le=10_000_000)
    """Most rows in one request (413 beyond)."""
    max_explain_rows: int = Field(10_000, ge=1, le=10_000_000)
    """Most rows one request may have reason codes for (413 beyond; scoring.explain on: every
    request's rows): each row's codes cost top_k names and values to find and to answer."""
    max_response_bytes: int = Field(64 << 20, ge=1024, le=1 << 34)
    """Largest answer: its size at most (rows, outputs, reason codes, text or binary) is
    worked out before scoring, and a request that could pass it is answered 413."""
    access_log: bool = False
    """Log every request (method, path, status, bytes, ms, client); 4xx and 5xx answers are
    logged either way, at most 10 a second (the rest counted in the next line)."""
    max_connections: int = Field(1024, ge=1, le=1_000_000)
    """Open connections at most; more are answered 503 and closed as they arrive (kept below
    the process's open-file limit, less 64)."""
    request_timeout_ms: int = Field(10_000, ge=100, le=600_000)
    """A request's headers and body must arrive within this (408, and the connection is
    closed: slow clients); a connection that sends nothing is closed after it."""
    keepalive_timeout_ms: int = Field(30_000, ge=100, le=3_600_000)
    """An idle keep-alive connection is closed after this."""
    allow_missing: bool = False
    """Fail-open: a request that leaves features out is scored with them missing in every
    row. By default it is answered 400 naming them (send null for a value that is
    missing)."""

    @model_validator(mode="after")
    def _ports(self):
        if self.grpc_port is not None and self.grpc_port != 0 and self.grpc_port == self.port:
            raise ValueError(f"serve.grpc_port ({self.grpc_port}) is serve.port: gRPC needs a "
                             "port of its own")
        return self


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level."""
    format: Literal["console", "json"] = "console"
    """Structured logs as JSON lines, or human-readable."""
    progress: bool = True
    """Progress bar for file sources; periodic rate lines for Kafka."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__",
                                      frozen=True, extra="forbid", case_sensitive=False,
                                      use_attribute_docstrings=True)

    source: SourceConfig
    sink: SinkConfig = Field(default_factory=lambda: SinkConfig(type="file",
                                                                path="out/scores.arrows"))
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    model: ModelConfig
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _within_the_memory_budget(self):
        d = self.delivery
        budget = d.memory_budget_mb << 20
        if d.max_batch_bytes > budget // 8:
            raise ValueError(f"delivery.max_batch_bytes: {d.max_batch_bytes} is more than an "
                             f"eighth of delivery.memory_budget_mb ({d.memory_budget_mb} MB)")
        if d.max_message_bytes is not None and d.max_message_bytes > budget // 4:
            raise ValueError(f"delivery.max_message_bytes: {d.max_message_bytes} is more than "
                             f"a quarter of delivery.memory_budget_mb ({d.memory_budget_mb} MB)")
        return self

    @model_validator(mode="after")
    def _monitoring_topic_needs_kafka(self):
        if self.monitoring.topic and self.sink.type != "kafka":
            raise ValueError("monitoring.topic: needs sink.type kafka (its brokers and "
                             "credentials publish the window records)")
        return self

    @property
    def message_byte_limit(self) -> int:
        """delivery.max_message_bytes, or its default from the memory budget."""
        d = self.delivery
        return d.max_message_bytes or (d.memory_budget_mb << 20) // 8

    @model_validator(mode="after")
    def _delivery_mode_holds(self):
        """exactly_once only where it holds: Kafka to Kafka (transactions) or file to file.
        Unset, the mode is at least once for the mixed pairs; set, it is a configuration
        error rather than a weaker guarantee in silence."""
        mixed = self.source.type != self.sink.type
        if mixed and self.delivery.mode == "exactly_once":
            if "mode" in self.delivery.model_fields_set:
                why = ("a Kafka source with a file sink: the file is fsynced before the "
                       "offsets commit" if self.source.type == "kafka" else
                       "a recording published to Kafka: a rerun publishes it again")
                raise ValueError(f"delivery.mode: exactly_once needs a Kafka source and a "
                                 f"Kafka sink (or files for both); {why}, which is "
                                 f"at_least_once: set delivery.mode: at_least_once")
            object.__setattr__(self.delivery, "mode", "at_least_once")
        return self

    @model_validator(mode="after")
    def _no_aliasing(self):
        """No output file may be an input of the same run (or the other output)."""
        ins = {"model.path": self.model.path}
        if self.model.shadow_path:
            ins["model.shadow_path"] = self.model.shadow_path
        if self.source.type == "file":
            ins["source.path"] = self.source.path
        outs = {}
        if self.sink.type == "file":
            outs = {"sink.path": self.sink.path,
                    "sink.dead_letter_path": self.sink.dead_letter_path}
            if _same_file(self.sink.path, self.sink.dead_letter_path):
                raise ValueError("sink.dead_letter_path is the same file as sink.path")
            if self.model.shadow_path and self.sink.shadow_path:
                outs["sink.shadow_path"] = self.sink.shadow_path
                if any(_same_file(self.sink.shadow_path, o) for o in
                       (self.sink.path, self.sink.dead_letter_path)):
                    raise ValueError("sink.shadow_path is the same file as another output")
        for out_key, out in outs.items():
            for in_key, inp in ins.items():
                if _same_file(out, inp):
                    raise ValueError(f"{out_key} is the same file as {in_key} ({inp}): the "
                                     "run would overwrite its own input")
        if self.sink.type == "kafka":
            # a topic the worker reads or writes scores to is never also its dead-letter topic
            # (a dead letter read back as input would be dead-lettered again, for ever)
            outs = {"sink.topic": self.sink.topic,
                    "sink.dead_letter_topic": self.sink.dead_letter_topic}
            if self.model.shadow_path:
                outs["sink.shadow_topic"] = self.sink.shadow_topic
            names = dict(outs)
            if self.source.type == "kafka":
                for t in self.source.topic.split(","):
                    if t.strip():
                        names.setdefault(f"source.topic ({t.strip()})", t.strip())
            seen: dict[str, str] = {}
            for key, topic in names.items():
                if topic in seen:
                    raise ValueError(f"{key} and {seen[topic]} are the same topic ({topic}): "
                                     "inputs, scores and dead letters each need their own")
                seen[topic] = key
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings: PydanticBaseSettingsSource,
                                   env_settings, dotenv_settings, file_secret_settings):
        return (env_settings, init_settings)  # the environment overrides the YAML file

    # ---- librdkafka dictionaries ----
    def consumer_config(self) -> dict[str, Any]:
        return {
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            # bound memory under a backlog: librdkafka's prefetch queue and fetch sizes, from
            # delivery.memory_budget_mb
            "queued.max.messages.kbytes": min(2_097_151,
                                              self.delivery.memory_budget_mb * 1024 // 16),
            "fetch.max.bytes": min(52_428_800, self.delivery.memory_budget_mb * 65536),
            "max.poll.interval.ms": 300_000,
            # low latency: a fetch returns after 10 ms without new data (librdkafka: 500 ms);
            # kafka.client may set it back
            "fetch.wait.max.ms": 10,
            **self.kafka.common(),
            # what the delivery guarantees depend on comes last (kafka.client cannot set it)
            "group.id": self.kafka.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
        }

    def producer_config(self, transactional: bool) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "linger.ms": 5,
            "queue.buffering.max.kbytes": min(2_147_483_647,
                                              self.delivery.memory_budget_mb * 1024 // 8),
            # the sink only looks at failed deliveries: no Python callback per message sent
            "delivery.report.only.error": True,
            **self.kafka.common(),
            "enable.idempotence": True,
        }
        if transactional:
            conf["transactional.id"] = self.kafka.transactional_id or (
                f"{self.kafka.group_id}-{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
            conf["transaction.timeout.ms"] = self.delivery.transaction_timeout_ms
        return conf


def _format_error(exc: ValidationError) -> str:
    lines = []
    errors = exc.errors()
    # a union's members each say why (source.fields: a path, or a FieldSpec): where a
    # FieldSpec was given (a mapping), only its own errors, without the member's name
    spec_at = {tuple(e["loc"][:e["loc"].index("FieldSpec")]) for e in errors
               if "FieldSpec" in e["loc"]}
    for err in errors:
        loc = list(err["loc"])
        if "str" in loc and tuple(loc[:loc.index("str")]) in spec_at:
            continue
        err = {**err, "loc": [p for p in loc if p != "FieldSpec"]}
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
            if not loc or msg.startswith(f"{loc}."):  # a check across fields names them
                lines.append(f"config error: {msg}")
                continue
        lines.append(f"config error: {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


class _CommandLineSettings(Settings):
    """Settings re-validated from file+environment values with command-line flags on top: no
    environment source, so a flag wins over SCORING_WORKER__* variables."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        return (init_settings,)


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def _check_file_secrets(data: dict, where: str) -> None:
    """A password belongs in the environment (or a secret store), not in a config file."""
    kafka = data.get("kafka")
    if not isinstance(kafka, dict) or kafka.get("allow_secrets_in_file") is True:
        return
    fields = [k for k in SECRET_FIELDS if kafka.get(k) is not None]
    client = kafka.get("client")
    in_client = [k for k in client if is_secret_key(k)] if isinstance(client, dict) else []
    found = [f"kafka.{k}" for k in fields] + [f"kafka.client.{k}" for k in in_client]
    if found:
        # every one named, each with its own way in (the first named alone, with the SASL
        # password's way for all, misled: found by mutation testing); kafka.client's: the
        # whole dictionary from the environment, as JSON
        ways = [f"{ENV_PREFIX}KAFKA__{k.upper()} or kafka.{SECRET_FIELDS[k]}" for k in fields]
        ways += [f"{ENV_PREFIX}KAFKA__CLIENT"] if in_client else []
        raise ConfigError(f"config error: {', '.join(found)}: "
                          f"{'a password' if len(found) == 1 else 'passwords'} in {where}; "
                          f"set {'it' if len(found) == 1 else 'them'} from the environment or "
                          f"a file ({'; '.join(ways)}), or set kafka.allow_secrets_in_file: "
                          "true")


def _check_environment() -> None:
    """Every SCORING_WORKER__ variable names a section this version has (a typo is an error,
    not a setting silently ignored)."""
    sections = set(Settings.model_fields)
    for key in os.environ:
        if not key.upper().startswith(ENV_PREFIX):
            continue
        section = key[len(ENV_PREFIX):].split("__", 1)[0].lower()
        if section not in sections:
            raise ConfigError(f"config error: {key}: unknown section {section!r} in the "
                              f"environment (sections: {', '.join(sorted(sections))})")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else v
    return out


def load_settings(path: str | Path | None = None, defaults: dict | None = None,
                  **overrides) -> Settings:
    """YAML file (optional; on top of ``defaults``), then the environment on top, then
    ``overrides`` (command-line flags: they win over both). Raises ConfigError naming the
    field."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config error: --config: file {p} does not exist")
        try:
            data = yaml.load(p.read_text(), Loader=_UniqueKeys) or {}  # noqa: S506 (safe)
        except yaml.YAMLError as exc:
            # the problem and where, never the offending line (it may hold a secret)
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise ConfigError(f"config error: {p} is not valid YAML: {problem}{where}") \
                from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config error: {p} is not valid YAML: {exc.reason}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config error: {p}: the top level must be a mapping of sections")
        _check_file_secrets(data, str(p))
    if defaults:
        data = _merge(defaults, data)
    _check_environment()
    try:
        settings = Settings(**_merge(data, overrides))  # the environment wins over both here
        if overrides:
            # validated again without the environment: the command line has the last word
            merged = _merge(settings.model_dump(mode="python"), overrides)
            settings = _CommandLineSettings(**merged)
        return settings
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None


def load_kafka_section(path: str | Path) -> KafkaConfig:
    """The kafka section of a worker config (file, then the environment): what the `record`
    command needs to reach the brokers."""
    return load_settings(path).kafka
