"""The package's structure: imports point one way (no cycle), the run loop knows no Kafka."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "worker"


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """worker.* modules imported anywhere in the file (functions and ``if TYPE_CHECKING:``
    blocks too: a cycle hidden from the interpreter is still a cycle)."""
    tree = ast.parse(path.read_text())
    here = _module(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import mod` imports the module; `from mod import name`, the module
            for a in node.names:
                sub = f"{mod}.{a.name}"
                where = PKG.parent / sub.replace(".", "/")
                is_module = (where.with_suffix(".py").exists() or where.is_dir()
                             or any(where.parent.glob(where.name + ".*.so")))
                target = sub if is_module else mod
                if target.startswith("worker"):
                    out.add(target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("worker")}
    return out


def _graph() -> dict[str, set[str]]:
    mods = {_module(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in mods and i != m} for m, p in mods.items()}


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_run_loop_knows_no_kafka_and_no_format():
    src = (PKG / "loop.py").read_text()
    assert "confluent_kafka" not in src and "io.kafka" not in src
    graph = _graph()
    assert "worker.io.kafka" not in graph["worker.loop"]
    # a message format is the pipeline's business: the loop sees Message and InvalidMessage
    # (worker.formats.base, through the package) and nothing of a format's reader or writer
    formats = {m for m in graph if m.startswith("worker.formats.") and m != "worker.formats.base"}
    formats |= {"worker.codec", "worker._ipc"}
    direct = graph["worker.loop"]
    assert not direct & formats, direct & formats


def test_the_pipeline_reads_formats_through_their_interface():
    direct = _graph()["worker.pipeline"]
    assert not {m for m in direct if m.startswith("worker.formats.")} and \
        "worker.codec" not in direct, direct


def test_the_lazy_policies_know_no_compiled_model():
    assert "worker.model.compiled" not in _imports(PKG / "model" / "lazy.py")
    tree = ast.parse((PKG / "model" / "lazy.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
              and isinstance(n.value, str) and n.value.isidentifier()}  # string annotations
    assert "CompiledModel" not in names


def test_model_package_imports_nothing_above_it():
    for path in (PKG / "model").glob("*.py"):
        above = {i for i in _imports(path) if not i.startswith(("worker.model", "worker._"))
                 and i != "worker"}
        assert not above, f"{path.name} imports {above}"


def test_an_old_key_is_accepted_with_a_warning():
    from worker.config import load_settings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = load_settings(None, scoring={"block_size": 64}, model={"path": "m.model"},
                          source={"type": "kafka", "topic": "t"})
    assert s.scoring.threads is None
    assert any("block_size" in str(w.message) for w in caught)
