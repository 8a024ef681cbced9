"""The README's configuration reference is the current rendering of the pydantic models."""

from pathlib import Path

from worker.configdoc import BEGIN, END, render

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_config_reference_is_current():
    text = README.read_text()
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    assert block == render().strip(), "run: python -m worker.configdoc --update README.md"


def test_readme_quick_start_commands_exist():
    text = README.read_text()
    makefile = (README.parent / "Makefile").read_text()
    assert "make demo" in text and "make test" in text
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "make test" in (README.parent / ".ci" / "run").read_text()
