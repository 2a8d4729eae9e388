"""README's layout block is generated from the packages' docstrings: it cannot drift."""

from __future__ import annotations

from pathlib import Path

from gateway.tools.layout import PACKAGE, layout_lines

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_block() -> list[str]:
    text = README.read_text()
    start = text.index("```\ngateway/\n") + len("```\n")
    return text[start : text.index("```", start)].rstrip("\n").split("\n")


def test_the_readme_layout_is_the_generated_one() -> None:
    assert _readme_block() == layout_lines()


def test_every_folder_of_the_package_has_a_line() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    named = {line.split()[0].rstrip("/") for line in layout_lines() if line.startswith("  ")}
    assert folders <= named
