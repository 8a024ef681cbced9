"""scoring-worker: exact, fast tree-ensemble scoring for Kafka streams of Arrow batches."""

# The public names are imported on first use (PEP 562), so `scoring-worker` can install its
# signal handlers before numpy, pyarrow and the kernels load (a SIGTERM during that second
# of start-up then exits 0 instead of killing the process).
_PUBLIC = {
    "ArtifactError": ".model.artifact",
    "compile_model": ".model.compile",
    "CompiledModel": ".model.compiled",
    "load_model": ".model.compiled",
    "UnsupportedModelError": ".model.ir",
    "ScoreResult": ".model.result",
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"

# Set by `scoring-worker`'s first signal handler (worker.cli) when SIGTERM/SIGINT comes while
# the modules load. That handler raises SystemExit, but CPython can lose an exception raised
# by a signal handler (seen here: a stop at 0.3 s, delivered while the import system ran, and
# the worker then started and ran), so the commands read this too once their modules load.
stop_requested_while_loading = False


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'worker' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
