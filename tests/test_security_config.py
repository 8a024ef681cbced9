"""Kafka security settings: secrets from files or the environment, never from the config file
or a log line; a combination that cannot work is a config error naming the field; what
librdkafka gets is what it accepts (a real client is built from it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from worker.config import ConfigError, load_settings

REPO = Path(__file__).resolve().parent.parent


def _load(tmp_path, kafka: dict, env: dict | None = None, monkeypatch=None):
    cfg = {"source": {"type": "kafka", "topic": "in"},
           "sink": {"type": "kafka", "topic": "out"},
           "model": {"path": "models/x.model"}, "kafka": kafka}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    return load_settings(path)


@pytest.fixture
def ca(tmp_path):
    p = tmp_path / "ca.pem"
    p.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(p)


def test_password_from_a_file_drops_one_trailing_newline(tmp_path, ca):
    secret = tmp_path / "password"
    secret.write_text("s3cr3t with spaces \n")
    s = _load(tmp_path, {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                         "sasl_username": "w", "sasl_password_file": str(secret),
                         "ssl_ca_location": ca})
    conf = s.kafka.common()
    assert conf["sasl.password"] == "s3cr3t with spaces "
    assert conf["security.protocol"] == "SASL_SSL" and conf["ssl.ca.location"] == ca
    assert conf["ssl.endpoint.identification.algorithm"] == "https"  # on by default
    # every client gets it: consumer and producer dictionaries
    assert s.consumer_config()["sasl.password"] == s.producer_config(True)["sasl.password"] \
        == "s3cr3t with spaces "
    # a secret rotated in its file is read again by the next client
    secret.write_text("rotated")
    assert s.kafka.common()["sasl.password"] == "rotated"


def test_secrets_from_the_environment_and_masked_in_the_log_view(tmp_path, monkeypatch):
    s = _load(tmp_path, {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                         "sasl_username": "w"},
              env={"SCORING_WORKER__KAFKA__SASL_PASSWORD": "env-secret-123"},
              monkeypatch=monkeypatch)
    assert s.kafka.common()["sasl.password"] == "env-secret-123"
    shown = json.dumps(s.kafka.masked())
    assert "env-secret-123" not in shown and '"sasl_password": "***"' in shown
    assert "env-secret-123" not in repr(s) and "env-secret-123" not in str(s.kafka)


@pytest.mark.parametrize("field", ["sasl_password", "ssl_key_password",
                                   "sasl_oauthbearer_client_secret"])
def test_a_secret_written_in_the_file_is_refused(tmp_path, field):
    with pytest.raises(ConfigError, match=f"kafka.{field}: a password in"):
        _load(tmp_path, {"security_protocol": "SASL_SSL", field: "plain-text"})


@pytest.mark.parametrize("kafka,error", [
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256"},
     "kafka.sasl_username is required for SCRAM-SHA-256"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "w"},
     "kafka.sasl_password is required for SCRAM-SHA-512"),
    ({"sasl_mechanism": "PLAIN", "sasl_username": "w"},
     "kafka.sasl_mechanism is PLAIN but kafka.security_protocol is PLAINTEXT"),
    ({"security_protocol": "SASL_PLAINTEXT", "ssl_ca_location": "{ca}",
      "sasl_mechanism": "GSSAPI"},
     "kafka.ssl_ca_location is set but kafka.security_protocol is SASL_PLAINTEXT"),
    ({"security_protocol": "SSL", "ssl_certificate_location": "{ca}"},
     "kafka.ssl_certificate_location and kafka.ssl_key_location go together"),
    ({"security_protocol": "SSL", "ssl_ca_location": "/nonexistent/ca.pem"},
     "kafka.ssl_ca_location: /nonexistent/ca.pem does not exist or cannot be read"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "w",
      "sasl_password_file": "/nonexistent/pw"},
     "kafka.sasl_password_file: /nonexistent/pw does not exist"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
      "sasl_oauthbearer_method": "oidc", "sasl_oauthbearer_client_id": "c"},
     "kafka.sasl_oauthbearer_token_endpoint_url is required for OAUTHBEARER oidc"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "w",
      "sasl_password_file": "{ca}", "sasl_oauthbearer_scope": "s"},
     "kafka.sasl_oauthbearer_scope is set but kafka.sasl_mechanism is not OAUTHBEARER"),
    ({"security_protocol": "TLS"}, "kafka.security_protocol: Input should be"),
])
def test_combinations_that_cannot_work_name_the_field(tmp_path, ca, kafka, error):
    kafka = {k: (v.format(ca=ca) if isinstance(v, str) else v) for k, v in kafka.items()}
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, kafka)
    assert error in str(info.value), str(info.value)


def test_both_a_secret_and_its_file_is_an_error(tmp_path, ca, monkeypatch):
    with pytest.raises(ConfigError, match="kafka.sasl_password and kafka.sasl_password_file"):
        _load(tmp_path, {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                         "sasl_username": "w", "sasl_password_file": ca},
              env={"SCORING_WORKER__KAFKA__SASL_PASSWORD": "x"}, monkeypatch=monkeypatch)


def test_librdkafka_accepts_every_security_setting(tmp_path, ca, monkeypatch):
    """OAUTHBEARER oidc with its secret from a file, hostname verification off: a real
    librdkafka client is built from the rendering (it refuses an unknown or invalid key).
    Mutual TLS and SCRAM are built against the secured brokers (tests/test_security.py)."""
    secret = tmp_path / "client-secret"
    secret.write_text("oidc-secret\n")
    oidc = _load(tmp_path, {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                            "sasl_oauthbearer_method": "oidc",
                            "sasl_oauthbearer_client_id": "scoring-worker",
                            "sasl_oauthbearer_client_secret_file": str(secret),
                            "sasl_oauthbearer_token_endpoint_url": "https://idp.example/token",
                            "sasl_oauthbearer_scope": "kafka",
                            "sasl_oauthbearer_extensions": "logicalCluster=lkc-1",
                            "ssl_endpoint_identification": False})
    conf = oidc.producer_config(transactional=False)
    assert conf["sasl.oauthbearer.client.secret"] == "oidc-secret"
    assert conf["sasl.oauthbearer.token.endpoint.url"] == "https://idp.example/token"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    Producer(conf)  # librdkafka validates every property at construction
    assert "oidc-secret" not in json.dumps(oidc.kafka.masked())


def test_bad_security_config_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "source": {"type": "kafka", "topic": "in"}, "sink": {"type": "kafka", "topic": "out"},
        "model": {"path": "m"},
        "kafka": {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_username": "w", "sasl_password_file": str(tmp_path / "absent")}}))
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "--config", str(cfg)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"config error: kafka.sasl_password_file: {tmp_path / 'absent'} does not exist or "
        "cannot be read"]


def test_client_cannot_override_the_security_fields(tmp_path):
    for key in ("security.protocol", "sasl.mechanism", "ssl.endpoint.identification.algorithm",
                "enable.ssl.certificate.verification"):
        with pytest.raises(ConfigError, match=f"kafka.client: .*'{key}' cannot be set here"):
            _load(tmp_path, {"client": {key: "x"}})


def test_every_secret_shaped_client_key_is_masked_and_refused_in_the_file(tmp_path):
    s = _load(tmp_path, {"allow_secrets_in_file": True,
                         "client": {"ssl.key.pem": "-----BEGIN PRIVATE KEY-----SECRET",
                                    "sasl.oauthbearer.config": "principal=x secret=TOP",
                                    "ssl.keystore.password": "ks", "linger.ms": 5}})
    shown = json.dumps(s.kafka.masked())
    assert "SECRET" not in shown and "TOP" not in shown and '"ks"' not in shown
    assert '"linger.ms": 5' in shown
    with pytest.raises(ConfigError, match=r"kafka.client.ssl.key.pem: a password in"):
        _load(tmp_path, {"client": {"ssl.key.pem": "-----BEGIN PRIVATE KEY-----"}})


def test_oauthbearer_needs_a_token_source(tmp_path):
    with pytest.raises(ConfigError, match="kafka.sasl_oauthbearer_method: OAUTHBEARER needs"):
        _load(tmp_path, {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"})


def test_a_yaml_error_never_echoes_the_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kafka:\n  sasl_password: Hunter2:secret: x\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "Hunter2" not in str(info.value) and "line 2" in str(info.value)


def test_plain_without_tls_is_warned_about(tmp_path, monkeypatch):
    s = _load(tmp_path, {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                         "sasl_username": "w"},
              env={"SCORING_WORKER__KAFKA__SASL_PASSWORD": "x"}, monkeypatch=monkeypatch)
    assert any("clear text" in w for w in s.kafka.warnings())


def test_every_secret_in_the_file_is_named_with_its_own_way_in(tmp_path):
    # not the first alone, and not the SASL password's way for a key password
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, {"security_protocol": "SASL_SSL", "sasl_password": "pw-A1",
                         "ssl_key_password": "pw-B2",
                         "client": {"ssl.keystore.password": "pw-C3"}})
    said = str(e.value)
    assert said.startswith("config error: kafka.sasl_password, kafka.ssl_key_password, "
                           "kafka.client.ssl.keystore.password: passwords in")
    for way in ("SCORING_WORKER__KAFKA__SASL_PASSWORD or kafka.sasl_password_file",
                "SCORING_WORKER__KAFKA__SSL_KEY_PASSWORD or kafka.ssl_key_password_file",
                "SCORING_WORKER__KAFKA__CLIENT"):
        assert way in said
    assert "pw-" not in said  # never the values


def test_a_client_key_naming_a_secret_is_a_secret_whatever_else_it_names(tmp_path):
    # "secret" alone (not "password", not one of librdkafka's own sensitive keys) is enough
    with pytest.raises(ConfigError, match="kafka.client.plugin.api.secret: a password in"):
        _load(tmp_path, {"client": {"plugin.api.secret": "TOP"}})
    s = _load(tmp_path, {"allow_secrets_in_file": True, "client": {"plugin.api.secret": "TOP"}})
    assert "TOP" not in json.dumps(s.kafka.masked())


@pytest.mark.parametrize("protocol,mechanism,warned", [
    ("SASL_PLAINTEXT", "PLAIN", True), ("SASL_SSL", "PLAIN", False),
    ("SASL_PLAINTEXT", "GSSAPI", False), ("SASL_PLAINTEXT", "OAUTHBEARER", False),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256", False)])
def test_only_a_plain_password_in_clear_text_is_warned_of(tmp_path, monkeypatch, protocol,
                                                          mechanism, warned):
    env = {"SCORING_WORKER__KAFKA__SASL_PASSWORD": "pw"} if mechanism in (
        "PLAIN", "SCRAM-SHA-256") else {}
    kafka = {"security_protocol": protocol, "sasl_mechanism": mechanism}
    if mechanism in ("PLAIN", "SCRAM-SHA-256"):
        kafka["sasl_username"] = "u"
    if mechanism == "OAUTHBEARER":  # a test broker's unsecured tokens
        kafka["client"] = {"enable.sasl.oauthbearer.unsecure.jwt": True}
    s = _load(tmp_path, kafka, env=env, monkeypatch=monkeypatch)
    assert any("in clear text" in w for w in s.kafka.warnings()) == warned


def test_one_secret_in_the_file_is_named_with_its_way_in_alone(tmp_path):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, {"security_protocol": "SASL_SSL", "sasl_password": "pw-A1"})
    said = str(e.value)
    assert said.startswith("config error: kafka.sasl_password: a password in")
    assert "set it from the environment or a file (SCORING_WORKER__KAFKA__SASL_PASSWORD or " \
           "kafka.sasl_password_file)" in said
    assert "KAFKA__CLIENT" not in said
