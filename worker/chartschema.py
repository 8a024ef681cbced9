"""The Helm chart's values.schema.json, generated: the chart's own values described from
values.yaml (each key typed by its default; no key beyond them), and `config:` described by the
worker's settings (pydantic's JSON schema of worker.config.Settings: every section and key, its
type and bounds, no unknown key). `helm lint` and `helm template` check values against it, so a
mistyped key or value is refused when rendering, not when the pod starts.

    python -m worker.chartschema --update deploy/helm/scoring-worker/values.schema.json
    python -m worker.chartschema --check deploy/helm/scoring-worker/values.schema.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "scoring-worker"

# objects passed through to Kubernetes as they are (their own API validates them)
FREE_FORM = {"resources", "podSecurityContext", "securityContext", "labels"}
# an Avro schema id as written: 0 to 2^32 - 1, no leading zero
AVRO_ID = (r"^(0|[1-9][0-9]{0,8}|[1-3][0-9]{9}|4[01][0-9]{8}|42[0-8][0-9]{7}|429[0-3][0-9]{6}"
           r"|4294[0-8][0-9]{5}|42949[0-5][0-9]{4}|429496[0-6][0-9]{3}|4294967[01][0-9]{2}"
           r"|42949672[0-8][0-9]|429496729[0-5])$")
# values whose default does not say their type, or that take only some strings
EXACT = {
    "mode": {"enum": ["stream", "serve"]},
    "kafka.securityProtocol": {"enum": ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]},
    "kafka.saslMechanism": {"enum": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512",
                                     "OAUTHBEARER"]},
    "delivery.mode": {"enum": ["exactly_once", "at_least_once"]},
    # YAML reads an unquoted off as false: taken as off, as the worker takes it
    # or the lazy section itself: its mode and the policy's parameters
    "scoring.lazy": {"anyOf": [{"enum": ["off", "certified", "lazyrf", "lazygbm", False]},
                               {"$ref": "#/$defs/LazyConfig"}]},
    "scoring.threads": {"type": "integer", "minimum": 1, "maximum": 256},
    "serve.grpcPort": {"type": ["integer", "null"], "minimum": 0, "maximum": 65535},
    "serve.port": {"type": "integer", "minimum": 1, "maximum": 65535},
    "metricsPort": {"type": "integer", "minimum": 1, "maximum": 65535},
    "image.pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    "avroSchemas": {"type": "object", "additionalProperties": {"type": ["object", "string"]},
                    # the id as the worker names its file: <id>.avsc, no leading zero, at
                    # most 2^32 - 1 (the wire format's 4 bytes: a larger id names a file no
                    # message can ask for)
                    "propertyNames": {"pattern": AVRO_ID}},
}


def _describe(value, path: str) -> dict:
    if path in EXACT:
        return dict(EXACT[path])
    name = path.rsplit(".", 1)[-1]
    if isinstance(value, dict):
        if name in FREE_FORM:
            return {"type": "object"}
        return {"type": "object", "additionalProperties": False,
                "properties": {k: _describe(v, f"{path}.{k}" if path else k)
                               for k, v in value.items()}}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": "array"}
    return {}  # null: any


def _as_the_worker_reads(defs: dict) -> None:
    """Where the worker's own validation refuses or accepts more than its fields' types say:
    kafka.client's reserved and secret librdkafka keys refused when rendering too, and a lazy
    mode of false (YAML's unquoted off) taken as off."""
    from .config import RESERVED_CLIENT_KEYS, SECRET_CLIENT_KEYS

    client = defs["KafkaConfig"]["properties"]["client"]
    client["propertyNames"] = {"not": {"anyOf": [
        {"enum": sorted(set(RESERVED_CLIENT_KEYS) | SECRET_CLIENT_KEYS)},
        {"pattern": "[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]|[Ss][Ee][Cc][Rr][Ee][Tt]"}]}}
    client["description"] = (client.get("description", "") + " (not the keys the worker "
                             "owns, and no secret: those are refused)").strip()
    mode = defs["LazyConfig"]["properties"]["mode"]
    defs["LazyConfig"]["properties"]["mode"] = {"anyOf": [mode, {"const": False}],
                                               "description": mode.get("description", "")}


def build(values_text: str) -> dict:
    from .config import Settings

    settings = Settings.model_json_schema()
    config = {k: v for k, v in settings.items() if k not in ("$defs", "title", "required")}
    # the sections' own required keys (model.path) are the chart's to set: not the value's
    defs = settings["$defs"]
    _as_the_worker_reads(defs)
    for section in config["properties"].values():
        ref = section.get("$ref", "")
        if ref.startswith("#/$defs/"):
            defs[ref.rsplit("/", 1)[1]].pop("required", None)
    config["description"] = ("The worker's own config (docs/configuration.md); the keys the "
                             "chart's values set are refused at render, naming the value.")
    values = yaml.safe_load(values_text)
    schema = _describe(values, "")
    schema["properties"]["config"] = config
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            "title": "scoring-worker chart values (generated: python -m worker.chartschema)",
            **schema, "$defs": settings["$defs"]}


def render(values_text: str) -> str:
    return json.dumps(build(values_text), indent=2, sort_keys=True) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--update", type=Path, metavar="SCHEMA")
    group.add_argument("--check", type=Path, metavar="SCHEMA")
    ap.add_argument("--values", type=Path, default=CHART / "values.yaml")
    args = ap.parse_args(argv)
    text = render(args.values.read_text())
    if args.update:
        args.update.write_text(text)
        return 0
    if not args.check.is_file() or args.check.read_text() != text:
        print(f"{args.check} is not what the settings generate: python -m worker.chartschema "
              f"--update {args.check}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
