"""Commands: run (--config), compile, profile, score, record, replay, serve, check, dead-letters."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
from pathlib import Path

_PACKAGE = __package__ or "worker"  # holds the flag (worker/__init__.py)


def _stop_requested() -> bool:
    return sys.modules[_PACKAGE].stop_requested_while_loading


def _stopped_while_loading(*_args):
    sys.modules[_PACKAGE].stop_requested_while_loading = True  # first
    with contextlib.suppress(OSError, ValueError):  # stderr closed: the stop still counts
        sys.stderr.write("stopped during start-up\n")
    raise SystemExit(0)


def _stop_lost_quietly(unraisable, previous=sys.unraisablehook) -> None:
    # a signal handler runs wherever the main thread is, inside a weakref callback of the
    # import system too, where CPython reports its SystemExit as "Exception ignored" and goes
    # on; the stop is not lost (the commands read the flag above once their modules are
    # loaded: _exit_if_stopped, startup.run), so neither is a traceback printed for it
    if unraisable.exc_type is SystemExit and _stop_requested():
        return
    previous(unraisable)


def _handle_stops_while_loading() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, _stopped_while_loading)
    sys.unraisablehook = _stop_lost_quietly


def _exit_if_stopped() -> None:
    """A command's modules are loaded: a stop whose SystemExit CPython lost ends it here."""
    if _stop_requested():
        sys.exit(0)


# Run as the command (not imported by a test): a SIGTERM/SIGINT from the first line of
# start-up exits 0 (Kubernetes stops starting pods during every rolling update); the run loop
# installs its own handling once the modules are loaded.
if __name__ == "__main__" or Path(sys.argv[0]).name == "scoring-worker":
    _handle_stops_while_loading()

import time  # noqa: E402

import click  # noqa: E402

from . import __version__  # noqa: E402


def _config_exit(message: str) -> None:
    """A bad argument or input: one line on stderr, exit 2 (no traceback)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _same_file(a, b) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


@click.group(invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="YAML config: run the worker until SIGTERM/SIGINT.")
@click.option("--explain-config", is_flag=True,
              help="Print where each feature the model reads comes from, and exit.")
@click.version_option(__version__, prog_name="scoring-worker")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, explain_config: bool) -> None:
    """Always-on scoring worker: Arrow, JSON or Avro messages in, tree-ensemble scores out."""
    if ctx.invoked_subcommand is not None:
        return
    if not config_path:
        click.echo(ctx.get_help())
        ctx.exit(2)
    if explain_config:
        from . import contract

        _exit_if_stopped()
        settings, model = _settings_and_model(config_path, None)
        click.echo(contract.table(_contract(model, settings)))
        sys.exit(0)
    from .startup import run_from_config

    sys.exit(run_from_config(config_path))


def _settings_and_model(config_path: str, model_path: str | None):
    """The settings and the model they name (``model_path`` wins): exit 2 naming what is
    wrong."""
    from .config import ConfigError, load_settings
    from .model.artifact import ArtifactError
    from .model.compiled import load_model

    over = {"model": {"path": model_path}} if model_path else {}
    try:
        settings = load_settings(config_path, **over)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    except FileNotFoundError:
        _config_exit(f"{config_path} does not exist")
    try:
        return settings, load_model(settings.model.path)
    except FileNotFoundError:
        _config_exit(f"model.path: {settings.model.path} does not exist")
    except ArtifactError as exc:
        _config_exit(f"model.path: {exc}")


def _contract(model, settings):
    from . import contract

    try:
        return contract.rows(model, settings)
    except ValueError as exc:
        click.echo(f"config error: {exc}", err=True)
        sys.exit(2)


@main.command("check")
@click.option("--config", "config_path", required=True,
              type=click.Path(exists=True, dir_okay=False), help="The worker's YAML config.")
@click.option("--sample", "sample_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Sample messages: a recorded topic (.arrows) or JSON lines "
              "(.jsonl, one message a line).")
@click.option("--model", "model_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Check this artifact instead of the config's model.path.")
def check_cmd(config_path, sample_path, model_path) -> None:
    """A dry run before production: each feature's source, kind and, with --sample, how
    often the sample's messages give it (present, null, absent, unseen category, refused)
    and the messages the worker would dead-letter, with why. Exit 1 where a required
    feature is never present."""
    from . import contract

    _exit_if_stopped()
    settings, model = _settings_and_model(config_path, model_path)
    rows = _contract(model, settings)
    if sample_path is None:
        click.echo(contract.table(rows))
        return
    try:
        records = contract.sample_values(sample_path)
    except (OSError, ValueError) as exc:
        _config_exit(f"--sample: {exc}")
    text, rc = contract.report(rows, contract.dry_run(model, settings, records))
    click.echo(text)
    sys.exit(rc)


def _profile_flags(f):
    """--bins and --threshold: the reference profile's bins and decision bands."""
    f = click.option("--threshold", "thresholds", multiple=True, type=float, default=(0.5,),
                     help="Decision threshold of the profile's band rates (repeat for "
                          "several).")(f)
    return click.option("--bins", type=click.IntRange(2, 100), default=10,
                        show_default=True,
                        help="Quantile bins a feature in the reference profile.")(f)


def _profile_options(ctx, reference, thresholds: tuple) -> None:
    """--bins and --threshold only with a reference; thresholds finite and increasing, as
    scoring.thresholds must be (exit 2 naming the option)."""
    from click.core import ParameterSource

    if reference is None:
        for name in ("bins", "thresholds"):
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
                raise click.UsageError(f"--{name.rstrip('s')} describes the reference "
                                       "profile: it needs --reference")
    if not all(math.isfinite(t) for t in thresholds) or \
            any(b <= a for a, b in zip(thresholds, thresholds[1:], strict=False)):
        raise click.BadParameter(f"{list(thresholds)}: finite and increasing",
                                 param_hint="--threshold")


def _reason(exc: Exception) -> str:
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


@main.command("compile")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the compiled model artifact.")
@click.option("--layout", type=click.Choice(["auto", "padded", "compact"]), default="auto",
              help="Node layout; auto times every layout the model allows on probe rows and "
                   "keeps the default unless another is 15% faster (stored in the artifact).")
@click.option("--kernel", type=click.Choice(["auto", "walk", "quickscorer", "oblivious", "lanes",
                                           "masks"]),
              default="auto",
              help="Full-evaluation kernel; auto: measured with the layout.")
@click.option("--trust-pickle", is_flag=True,
              help="Allow a joblib/pickle source: loading one runs code from the file.")
@click.option("--float32-inputs", is_flag=True,
              help="Accept an ONNX model with a double input whose thresholds are not float32 "
                   "values: exact for inputs that are float32 values (the worker stages "
                   "float32).")
@click.option("--reference", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Training rows (.parquet, .arrow, .csv; columns by feature name) profiled "
                   "into the artifact for flight monitoring (drift, missing rates, score "
                   "health).")
@_profile_flags
@click.pass_context
def compile_cmd(ctx, source: str, output: str, layout: str, kernel: str, trust_pickle: bool,
                float32_inputs: bool, reference: str | None, bins: int,
                thresholds: tuple) -> None:
    """Compile an XGBoost model (.json/.ubj), a LightGBM model file (.txt/.lgb), a CatBoost
    model (.cbm or its .json export), an ONNX tree ensemble (.onnx) or a scikit-learn
    estimator file (.skops, read with an allow-list of tree-ensemble types; joblib/pickle only
    with --trust-pickle) into a data-only model artifact, checked against the library's own
    predictions first. Its notes (early stopping, inputs) are printed after the summary."""
    from .model.compile import compile_model
    from .model.ir import UnsupportedModelError

    _exit_if_stopped()
    _profile_options(ctx, reference, thresholds)
    if _same_file(source, output):
        _config_exit("-o/--output: would overwrite the source model")
    if trust_pickle:
        click.echo(f"warning: --trust-pickle: loading {source} runs code from the file",
                   err=True)
    try:
        model = compile_model(source, layout=layout, trust_pickle=trust_pickle, kernel=kernel,
                              float32_inputs=float32_inputs, reference=reference, bins=bins,
                              thresholds=thresholds)
    except (KeyError, TypeError) as exc:  # the reference's columns
        raise click.ClickException(f"cannot profile {reference}: {_reason(exc)}") from None
    except UnsupportedModelError as exc:
        raise click.ClickException(f"cannot compile {source}: {exc}") from None
    except ValueError as exc:  # e.g. a forced layout or kernel the model cannot take
        raise click.ClickException(f"cannot compile {source}: {exc}") from None
    model_id = model.save(output)
    c = model.kernel_choice
    timed = ", ".join(f"{k} {v:.3g} us" for k, v in c["us_per_row"].items())
    click.echo(f"{output}: {model.kind} ({model.source}, {model.objective or model.task}), "
               f"{model.n_trees} trees, {model.work_total} work units, {model.n_features} "
               f"features, layout {model.layout}, kernel {model.kernel} ({c['by']}"
               + (f"; per probe row: {timed}" if timed else "") + f"), model id {model_id}")
    for note in model.meta.get("notes") or []:  # what the compile chose that scores differ by
        click.echo(f"  note: {note}")
    if model.reference is not None:
        click.echo(f"  reference profile: {model.reference.rows:,} rows, {bins} bins a "
                   f"feature, decision bands at {list(thresholds)} (flight monitoring)")


@main.command("profile")
@click.argument("model_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--reference", type=click.Path(exists=True, dir_okay=False),
              help="Training rows (.parquet, .arrow, .csv; columns by feature name).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Where to write the artifact with its profile (the same model id).")
@click.option("--show", is_flag=True,
              help="Print the artifact's profile: each feature's bin edges, reference "
                   "shares, missing share and range; the score's bins and band rates.")
@_profile_flags
@click.pass_context
def profile_cmd(ctx, model_path: str, reference: str | None, output: str | None, bins: int,
                thresholds: tuple, show: bool) -> None:
    """Add a reference profile (flight monitoring's baseline) to a compiled model, or
    --show the one it has (what a drift alert compares the scored rows with)."""
    from .model.artifact import ArtifactError
    from .model.compile import reference_rows
    from .model.compiled import load_model

    if show:
        try:
            _show_profile(load_model(model_path))
        except ArtifactError as exc:
            raise click.ClickException(str(exc)) from None
        return
    if reference is None or output is None:
        raise click.UsageError("--reference and -o/--output are needed (or --show)")
    _profile_options(ctx, reference, thresholds)

    try:
        model = load_model(model_path).with_reference(reference_rows(reference), bins,
                                                      thresholds)
    except ArtifactError as exc:
        raise click.ClickException(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise click.ClickException(f"cannot profile {reference}: {_reason(exc)}") from None
    model_id = model.save(output)
    p = model.reference
    click.echo(f"{output}: reference of {p.rows:,} rows, {len(p.n_edges)} features in up to "
               f"{bins} bins, model id {model_id} (unchanged)")


def _show_profile(model) -> None:
    doc = model.meta.get("reference")
    if doc is None:
        raise click.ClickException(f"{model.model_id[:12]}: no reference profile (compile "
                                   "--reference, or scoring-worker profile --reference)")
    click.echo(f"reference profile: {doc['rows']:,} rows, up to {doc['bins']} bins a feature "
               f"(a value's bin: how many edges are <= it)")
    for f in doc["features"]:
        shares = " ".join(f"{100 * x:.1f}" for x in f["fractions"])
        click.echo(f"  {f['name']}: missing {100 * f['missing']:.1f}%, range "
                   f"[{f['min']}, {f['max']}]{', categories' if f['categorical'] else ''}")
        click.echo(f"    edges {[round(e, 6) for e in f['edges']]}")
        click.echo(f"    shares % {shares}")
    s = doc["score"]
    click.echo(f"  score: edges {[round(e, 6) for e in s['edges']]}")
    click.echo(f"    shares % {' '.join(f'{100 * x:.1f}' for x in s['fractions'])}")
    click.echo(f"    bands at {s['thresholds']}: "
               + " ".join(f"{100 * x:.1f}%" for x in s["band_rates"]))


@main.command("score")
@click.option("--model", "model_path", required=True, type=click.Path(exists=True))
@click.option("--input", "input_path", required=True, type=click.Path(exists=True))
@click.option("--output", "output_path", required=True, type=click.Path())
@click.option("--lazy", default="off",
              type=click.Choice(["off", "certified", "lazyrf", "lazygbm"]))
@click.option("--threshold", "thresholds", multiple=True, type=float, default=(0.5,),
              help="Decision threshold (repeat for several bands).")
@click.option("--id-column", default=None, help="Column passed through as `id`.")
@click.option("--threads", type=int, default=None)
@click.option("--param", "params", multiple=True, help="Lazy policy parameter KEY=VALUE.")
@click.option("--explain", type=click.Choice(["treeshap", "path"]), default=None,
              help="Reason codes (reason_feature, reason_value, reason_bias) for rows scored at "
                   "or above --explain-min-score.")
@click.option("--top-k", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Features named per explained row.")
@click.option("--explain-min-score", type=float, default=None,
              help="Explain rows scored at or above this (default: the lowest threshold).")
def score_cmd(model_path, input_path, output_path, lazy, thresholds, id_column, threads,
              params, explain, top_k, explain_min_score) -> None:
    """Score an Arrow IPC or Parquet file offline with the same kernels as the worker."""
    import pyarrow as pa

    from .codec import output_metadata, result_batch
    from .io.tables import read_table, write_table
    from .model.artifact import ArtifactError
    from .model.compiled import load_model

    _exit_if_stopped()

    if _same_file(input_path, output_path) or _same_file(model_path, output_path):
        _config_exit("--output: would overwrite an input of this command")
    try:
        model = load_model(model_path)
    except ArtifactError as exc:
        _config_exit(f"--model: {exc}")
    try:
        table = read_table(input_path)
        table.validate(full=True)  # nothing native reads a buffer pyarrow has not checked
    except (pa.ArrowException, OSError, ValueError) as exc:
        _config_exit(f"--input: {input_path} is not a readable Arrow IPC or Parquet table: "
                     f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    kw = {}
    for p in params:
        key, _, value = p.partition("=")
        try:
            kw[key] = int(value) if value.isdigit() else float(value)
        except ValueError:
            kw[key] = value
    t0 = time.perf_counter()
    try:
        from .model.compiled import refuse_codes

        refuse_codes(table, set(model.categories or {}))  # names, as the stream reads them
        r = model.score_batch(table, lazy=lazy, thresholds=list(thresholds), n_threads=threads,
                              explain=explain, top_k=top_k, explain_min_score=explain_min_score,
                              **kw)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise click.ClickException(f"{input_path}: {exc}") from None
    elapsed = time.perf_counter() - t0
    if id_column and id_column not in table.column_names:
        raise click.ClickException(f"{input_path}: no id column {id_column!r}")
    ids = table.column(id_column).combine_chunks() if id_column else None
    batch = result_batch(ids, r, model.task != "regression", feature_names=model.feature_names)
    out = pa.Table.from_batches([batch]).replace_schema_metadata(
        output_metadata(model, source_file=Path(input_path).name))
    write_table(output_path, out)
    n = len(r)
    click.echo(f"scored {n} rows in {elapsed * 1e3:.1f} ms ({n / max(elapsed, 1e-9):,.0f} rows/s),"
               f" mean work {r.work_units.mean() if n else 0:.1f} of {model.work_total}"
               f" -> {output_path}")


@main.command("record")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="Worker config whose kafka section (brokers, TLS, SASL) the recorder uses.")
@click.option("--bootstrap-servers", "--bootstrap", "bootstrap_servers", default=None,
              help="Kafka bootstrap servers (host:port list; default: the config's, else "
                   "127.0.0.1:9092).")
@click.option("--topic", required=True)
@click.option("--output", required=True, type=click.Path(dir_okay=False),
              help="Recorded topic file (.arrows).")
@click.option("--from-offset", default="earliest", show_default=True,
              help="earliest, latest, or an offset applied to every partition.")
@click.option("--from-timestamp", type=int, default=None,
              help="Start at the first message at or after this Unix time in milliseconds.")
@click.option("--max-messages", type=int, default=None)
@click.option("--max-seconds", type=float, default=None)
def record_cmd(config_path, bootstrap_servers, topic, output, from_offset, from_timestamp,
               max_messages, max_seconds) -> None:
    """Record a topic's committed messages into a file, for replay tests."""
    from confluent_kafka import KafkaException
    from rich.progress import Progress

    from .config import ConfigError, KafkaConfig, load_kafka_section
    from .replay import record_topic

    _exit_if_stopped()
    try:
        kafka = load_kafka_section(config_path) if config_path else KafkaConfig()
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    client = kafka.common()
    bootstrap = bootstrap_servers or client.pop("bootstrap.servers")
    client.pop("bootstrap.servers", None)
    with Progress(transient=True) as bar:
        task = bar.add_task(f"recording {topic}", total=max_messages)
        try:
            n = record_topic(bootstrap, topic, output, from_offset=from_offset,
                             from_timestamp_ms=from_timestamp, max_messages=max_messages,
                             max_seconds=max_seconds, client=client,
                             progress=lambda k: bar.advance(task, k))
        except (ValueError, RuntimeError, KafkaException) as exc:
            raise click.ClickException(str(exc).splitlines()[0]) from None
    click.echo(f"recorded {n} messages from {topic} -> {output}")


@main.command("dead-letters")
@click.option("--config", "config_path", required=True,
              type=click.Path(exists=True, dir_okay=False),
              help="Worker config: its sink names the dead letters (topic or file), its "
              "kafka section how to reach them, its source.topic where a requeue writes.")
@click.option("--reason", "reasons", multiple=True,
              help="Only letters of this reason (error_code; repeat for several).")
@click.option("--since", default=None,
              help="Only letters written at or after this time (a file sink's keep their "
              "input's time): ISO 8601 (UTC unless it says) or an age (30m, 2h, 7d).")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Letters printed (default: 20 after the summary; with --json every one; "
              "0: the summary only).")
@click.option("--json", "as_json", is_flag=True,
              help="The selected letters as JSON lines (bytes that are not UTF-8 as base64), "
              "no summary.")
@click.option("--requeue", is_flag=True,
              help="Write the selected letters' originals back to their input topic, each "
              "once (in transactions, with a requeued_from header naming the letter).")
def dead_letters_cmd(config_path, reasons, since, limit, as_json, requeue) -> None:
    """Summarise and print the dead letters by reason; with --requeue, send the originals
    back to the input once their cause is fixed."""
    from .config import ConfigError, load_settings
    from .deadletters import (
        DeadLetterError,
        FileReader,
        Selection,
        TopicReader,
        describe,
        parse_since,
        scan,
    )
    from .deadletters import requeue as requeue_letters

    _exit_if_stopped()

    class Stopped(BaseException):
        pass

    def stop(signum, _frame):
        raise Stopped(signum)

    # a stop ends the command (a requeue's open transaction aborted first), never as success
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if requeue and (as_json or limit is not None):
        raise click.UsageError("--requeue takes --reason and --since; --json and --limit are "
                               "for listing")
    try:
        settings = load_settings(config_path)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    try:
        selection = Selection(frozenset(reasons), parse_since(since) if since else None)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sink, kafka = settings.sink, settings.kafka
    if requeue and (sink.type != "kafka" or settings.source.type != "kafka"):
        _config_exit("--requeue writes back to a Kafka input: the config's source and sink "
                     "must be Kafka (source.type, sink.type)")
    if sink.type == "kafka":
        from .startup import configure_logging

        configure_logging(settings.logging.level, settings.logging.format)
    timeout = kafka.connect_timeout_s
    reader = None
    try:
        if requeue:
            topics = [t.strip() for t in settings.source.topic.split(",") if t.strip()]
            written, skipped = requeue_letters(
                kafka.common(), sink.dead_letter_topic, topics, selection, timeout,
                say=lambda line: click.echo(line, err=True))
            click.echo(f"requeued {written:,} letters from {sink.dead_letter_topic} to "
                       f"{', '.join(topics)}")
            for why, n in skipped.most_common():
                click.echo(f"  not requeued: {n:,} ({why})")
            return
        if sink.type == "kafka":
            reader = TopicReader(kafka.common(), sink.dead_letter_topic, timeout)
            reader.bounds(wait_s=min(timeout, 5.0))  # the worker's transactions are short
            where = sink.dead_letter_topic
        else:
            reader = FileReader(sink.dead_letter_path)
            where = sink.dead_letter_path
        if as_json:
            import json

            def show(letter, requeued):
                click.echo(json.dumps({**letter.view(), "requeued": requeued},
                                      ensure_ascii=False))

            scan(reader, selection, show, limit)
        else:
            shown: list = []
            summary = scan(reader, selection, lambda *a: shown.append(a),
                           20 if limit is None else limit)
            for line in summary.lines(where):
                click.echo(line)
            for letter, requeued in shown:
                click.echo("")
                for line in describe(letter, requeued):
                    click.echo(line)
            if summary.selected > summary.shown and summary.shown:
                click.echo(f"\n({summary.selected - summary.shown:,} more: --limit, --reason, "
                           "--since or --json)")
        for warning in reader.warnings:
            click.echo(f"warning: {warning}", err=True)
    except DeadLetterError as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    except Stopped as stopped:
        click.echo("dead-letters: stopped" + (" (a requeue's open transaction aborted: "
                                              "nothing of it written)" if requeue else ""),
                   err=True)
        sys.exit(128 + stopped.args[0])
    finally:
        if reader is not None:
            reader.close()


@main.command("replay")
@click.argument("input_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="Worker config for scoring settings (source and sink are replaced).")
@click.option("--model", "model_path", type=click.Path(exists=True), default=None)
@click.option("--shadow", "shadow_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="A challenger scored beside the model: prints the decision "
              "agreement table (its scores: <output stem>-shadow.arrows).")
@click.option("--output", type=click.Path(dir_okay=False), default=None,
              help="Scores file (.arrows); default out/replay-scores.arrows.")
@click.option("--topic", default=None, help="Publish scores to this topic instead of a file.")
@click.option("--bootstrap-servers", "--bootstrap", "bootstrap_servers", default=None,
              help="Kafka bootstrap servers for --topic (default: the config's).")
@click.option("--expect", "expect", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Golden scores file: compare id by id, exit 1 on any difference.")
@click.option("--atol", type=float, default=1e-9, show_default=True)
@click.option("--rtol", type=float, default=0.0, show_default=True)
def replay_cmd(input_path, config_path, model_path, shadow_path, output, topic, bootstrap_servers,
               expect, atol, rtol) -> None:
    """Replay a recorded topic through the worker pipeline (file -> worker -> file or topic)."""
    from . import startup
    from .config import ConfigError, load_settings
    from .replay import agreement, compare

    _exit_if_stopped()
    if shadow_path and topic:
        raise click.UsageError("--shadow compares two scores files: use --output, not --topic")
    if expect and topic:
        raise click.UsageError("--expect compares a scores file: use --output, not --topic")
    output = output or "out/replay-scores.arrows"
    # command-line flags win over the config file and the environment; source and sink are
    # replaced whole
    over = {"source": {"type": "file", "path": input_path, "topic": None},
            "sink": ({"type": "kafka", "topic": topic, "path": None, "dead_letter_path": None,
                      "dead_letter_topic": None} if topic
                     else {"type": "file", "path": output, "dead_letter_path": None,
                           "topic": None, "dead_letter_topic": None}),
            "delivery": {"mode": "at_least_once"}}
    if model_path:
        over["model"] = {"path": model_path}
    if shadow_path:
        over.setdefault("model", {})["shadow_path"] = shadow_path
    if bootstrap_servers:
        over["kafka"] = {"bootstrap_servers": bootstrap_servers}
    try:
        settings = load_settings(config_path, **over)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    rc = startup.run(settings, summary=expect is None and shadow_path is None)
    # the comparison is not the run: a stop from here ends the command as a signal does (not
    # as "stopped during start-up", exit 0, which would read as a pass)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if rc != 0:
        sys.exit(rc)
    if startup.stopped_by_signal and (shadow_path or expect):
        click.echo("replay stopped before the end of the recording: nothing compared",
                   err=True)
        sys.exit(1)
    if shadow_path:
        click.echo(agreement(output, settings.sink.shadow_path,
                             len(settings.scoring.thresholds) + 1))
    if expect:
        result = compare(output, expect, atol=atol, rtol=rtol)
        click.echo(result.summary())
        sys.exit(0 if result.ok else 1)


@main.command("serve")
@click.option("--model", "model_path", default=None, type=click.Path(dir_okay=False),
              help="Compiled model artifact (default: the config's model.path).")
@click.option("--name", default=None, help="The model's name in the URLs (default: the "
              "artifact's file stem).")
@click.option("--host", default=None, help="Bind address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default 8080; 0: any free one).")
@click.option("--workers", type=int, default=None,
              help="Processes sharing the port (default 1).")
@click.option("--grpc-port", "grpc_port", type=int, default=None,
              help="Also serve the protocol's gRPC half on this port (0: any free one; "
              "default: the config's serve.grpc_port, else no gRPC).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Worker config: its serve, scoring, model and logging "
              "sections apply.")
def serve_cmd(model_path, name, host, port, workers, grpc_port, config_path) -> None:
    """Synchronous scoring over the Open Inference Protocol (KServe v2): JSON, binary tensors
    and Arrow bodies at POST /v2/models/NAME/infer, and its gRPC half with --grpc-port."""
    from . import startup
    from .config import ConfigError, load_settings
    from .serve.server import serve_workers
    from .serve.service import Service

    _exit_if_stopped()
    over: dict = {}
    if model_path:
        over["model"] = {"path": model_path}
    serve = {k: v for k, v in (("name", name), ("host", host), ("port", port),
                               ("workers", workers), ("grpc_port", grpc_port))
             if v is not None}
    if serve:
        over["serve"] = serve
    # serve reads no source: a config without one (or none at all) is complete
    defaults = {"source": {"type": "file", "path": os.devnull}}
    if not model_path and not config_path:
        raise click.UsageError("--model (or --config with model.path) is required")
    try:
        settings = load_settings(config_path, defaults=defaults, **over)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    path = settings.model.path
    if not os.path.isfile(path):
        _config_exit(f"model.path: {path} does not exist")
    startup.configure_logging(settings.logging.level, settings.logging.format)
    model_name = settings.serve.name or Path(path).stem
    s = settings.serve

    def listening(address, grpc_bound) -> None:
        also = "" if grpc_bound is None else f" and grpc on {address[0]}:{grpc_bound}"
        click.echo(f"serving {model_name!r} on http://{address[0]}:{address[1]}/v2{also} "
                   f"({s.workers} worker{'s' if s.workers > 1 else ''})", err=True)

    try:
        rc = serve_workers(lambda: Service(settings, path, model_name), s.host, s.port,
                           s.workers, listening, s.grpc_port)
    except OSError as exc:  # the address is taken, not ours, unknown
        key, at = ("serve.grpc_port", s.grpc_port) if "gRPC" in str(exc) else \
            ("serve.port", s.port)
        _config_exit(f"{key}: cannot listen on {s.host}:{at}: {exc.strerror or exc}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
