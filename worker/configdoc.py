"""Render the configuration reference (docs/configuration.md) from the pydantic models:
`python -m worker.configdoc` prints it, `python -m worker.configdoc --update
[docs/configuration.md]` writes it between the markers. A test checks the page carries the
current rendering."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pydantic import BaseModel

from .config import ENV_PREFIX, Settings

BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"
PAGE = "docs/configuration.md"  # where the reference is, from the repository's root


def _type_name(annotation) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = text.replace("typing.", "").replace("pydantic.types.", "") \
        .replace("worker.config.", "")
    return re.sub(r"<class '([\w.]+)'>", lambda m: m.group(1).split(".")[-1], text)


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models a dict's values may be (``dict[str, str | FieldSpec]``)."""
    import typing

    if typing.get_origin(annotation) is not dict:
        return []
    value = typing.get_args(annotation)[1]
    options = typing.get_args(value) or (value,)
    return [t for t in options if isinstance(t, type) and issubclass(t, BaseModel)]


def _optional_model(annotation) -> type[BaseModel] | None:
    """The section an optional field holds when set (``ExplainConfig | None``)."""
    import typing

    options = [t for t in typing.get_args(annotation) if t is not type(None)]
    if len(options) == 1 and isinstance(options[0], type) and \
            issubclass(options[0], BaseModel):
        return options[0]
    return None


def _text(doc: str) -> str:
    """A description as a table cell: pipes escaped, and a ``<`` outside code spans written
    ``&lt;`` so that ``<topic>-dlq`` shows as text, not as an HTML tag."""
    doc = doc.replace("|", "\\|").replace("\n", " ")
    parts = re.split(r"(`[^`]*`)", doc)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in parts)


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(section)"
        return repr(value)
    return repr(field.default)


def _range(field) -> str:
    """The bounds a field's value is held to (``a .. b``, ``>= a``, ``<= b``; a text's length
    in characters), as validation enforces them: tests/test_config_bounds.py tries each."""
    lo = hi = None
    chars = above = False
    for m in field.metadata:
        for attr, is_lo, is_len in (("ge", True, False), ("le", False, False),
                                    ("min_length", True, True), ("max_length", False, True),
                                    ("gt", True, False)):
            if hasattr(m, attr) and getattr(m, attr) is not None:
                lo, hi = (getattr(m, attr), hi) if is_lo else (lo, getattr(m, attr))
                chars = chars or is_len
                above = above or attr == "gt"
    if lo is None and hi is None:
        return ""
    if above:  # an open lower end: more than lo
        text = f"> {lo}, <= {hi}" if hi is not None else f"> {lo}"
    else:
        text = f"{lo} .. {hi}" if lo is not None and hi is not None else \
            f">= {lo}" if lo is not None else f"<= {hi}"
    return f"`{text}`" + (" characters" if chars else "")


def render() -> str:
    lines = ["| key | type | default | range | meaning |", "|---|---|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str):
        for name, field in model.model_fields.items():
            ann = field.annotation
            key = f"{prefix}{name}"
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, key + ".")
                continue
            doc = _text(field.description or "")
            typ = _type_name(ann).replace("|", "\\|")
            lines.append(f"| `{key}` | `{typ}` | `{_default(field)}` | {_range(field)} | "
                         f"{doc} |")
            for inner in _models_in(ann):  # dict values that are sections of their own
                walk(inner, key + ".<name>.")
            inner = _optional_model(ann)
            if inner is not None:  # a section that is off until set
                walk(inner, key + ".")
        if model.model_config.get("extra") == "allow":
            lines.append(f"| `{prefix}<param>` | any | | | policy parameter, e.g. "
                         "`tau: 0.95` |")

    walk(Settings, "")
    lines.append("")
    lines.append(f"Every key can be set from the environment as `{ENV_PREFIX}SECTION__KEY` "
                 f"(e.g. `{ENV_PREFIX}KAFKA__BOOTSTRAP_SERVERS`); the environment wins over "
                 "the file.")
    return "\n".join(lines)


def update_page(path: Path) -> bool:
    text = path.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:start] + "\n" + render() + "\n" + text[end:]
    if new != text:
        path.write_text(new)
        return True
    return False


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--update":
        path = Path(sys.argv[2] if len(sys.argv) > 2 else PAGE)
        changed = update_page(path)
        print(f"{path} updated" if changed else f"{path} already current")
    else:
        print(render())
