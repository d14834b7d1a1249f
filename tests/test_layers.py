"""Layers that hold: no module imports a module of a higher layer, at module level or inside a
function (CPU only, reads the sources; imports nothing of the package).

The layers, lowest first, are the rows of the README's layout table ("Layout, in pipeline order"),
read from the README itself: a module may import its own layer and any layer below. The package's
face (``stitchcuda/__init__.py``: lazy ``build_program``, ``optimize``, ``Program``) is on the top
layer with the commands, so nothing below imports it; the native binding ``stitchcuda._rt`` is
below every layer.
A module or folder of the package that no row names fails the test too, so the table stays whole.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "python" / "stitchcuda"
README = REPO / "README.md"


def readme_layers(text: str | None = None) -> list[list[str]]:
    """The top-level modules and folders of the package each row of the README's layout table
    names, in order (``python/stitchcuda/x.py`` or ``x.py`` in the first cell, ``x/`` for a folder)."""
    text = README.read_text(encoding="utf-8") if text is None else text
    section = text.split("## Layout, in pipeline order", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        if not line.startswith("| `python/stitchcuda"):
            continue
        cell = line.split("|")[1]
        names = []
        for tok in re.findall(r"`([^`]+)`", cell):
            tok = tok.removeprefix("python/stitchcuda/").rstrip("/")
            if tok.endswith(".py"):
                tok = tok[:-3]
            if tok and "/" not in tok and tok != "python":
                names.append(tok)
        layers.append(names)
    return layers


def _top(module: str) -> str:
    """``stitchcuda.plan.lower`` -> ``plan``; the package itself -> ``stitchcuda``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_imports(root: Path = PACKAGE) -> list[tuple[str, str, int]]:
    """Every import of the package by the package: (importing module, imported module, line), at
    module level and inside functions alike; ``from .x import name`` counts as importing ``x``
    (or ``x.name`` when that is a module)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("stitchcuda"):
                    continue
                for alias in node.names:
                    sub = root.parent.joinpath(*f"{target}.{alias.name}".split("."))
                    is_module = sub.with_suffix(".py").is_file() or sub.is_dir() or sub.with_suffix(".pyi").is_file()
                    full = f"{target}.{alias.name}" if is_module else target
                    out.append((module, full, node.lineno))
            elif isinstance(node, ast.Import):
                out += [(module, a.name, node.lineno) for a in node.names if a.name.startswith("stitchcuda")]
    return out


def upward_imports(layers: list[list[str]], imports) -> list[str]:
    """The imports that point to a higher layer, or to the package's face, as readable lines."""
    rank = {name: i for i, row in enumerate(layers) for name in row}
    rank["_rt"] = -1
    top = len(layers) - 1
    bad = []
    for src, dst, line in imports:
        a, b = _top(src), _top(dst)
        if a == b or src == "stitchcuda":
            continue
        if b == "stitchcuda":
            if rank.get(a, 1 << 30) < top:
                bad.append(f"{src} (line {line}) imports the package's face; import the module that defines the name")
        elif rank.get(b, 1 << 30) > rank.get(a, 1 << 30):
            bad.append(f"{src} (line {line}) imports {dst}: layer '{b}' is above layer '{a}'")
    return sorted(set(bad))


def test_the_readme_table_names_every_module_and_folder_once():
    layers = readme_layers()
    assert layers, "the README's layout table has no rows for python/stitchcuda"
    named = [n for row in layers for n in row]
    assert len(named) == len(set(named)), f"named twice: {[n for n in named if named.count(n) > 1]}"
    present = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"} | \
        {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    present.discard("_rt")
    assert sorted(present - set(named)) == [], "modules or folders the README's layout table does not name"
    assert sorted(set(named) - present) == [], "the README's layout table names what is not there"


def test_no_module_imports_a_higher_layer():
    bad = upward_imports(readme_layers(), package_imports())
    assert not bad, "imports that break the layers:\n  " + "\n  ".join(bad)


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: a planner module that imports the Verifier (inside a function) fails it."""
    pkg = tmp_path / "stitchcuda"
    for d in ("plan", "verifier"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "plan" / "lower.py").write_text("def f():\n    from ..verifier import run\n    return run\n")
    (pkg / "verifier" / "run.py").write_text("from ..plan import lower\n")
    (pkg / "verifier" / "face.py").write_text("from .. import optimize\n")
    layers = [["plan"], ["verifier"], ["cli"]]
    bad = upward_imports(layers, package_imports(pkg))
    assert len(bad) == 2, bad
    assert "stitchcuda.plan.lower (line 2) imports stitchcuda.verifier.run: layer 'verifier' is above layer 'plan'" in bad
    assert any("imports the package's face" in b for b in bad)


@pytest.mark.parametrize("row", ["| `python/stitchcuda/kinds/` | plan | ... |"])
def test_the_table_reader_takes_folders_and_modules(row):
    text = "## Layout, in pipeline order\n\n| a | b | c |\n|---|---|---|\n" + row + \
        "\n| `python/stitchcuda/ir.py`, `layout.py` | x | y |\n\n## Next\n"
    assert readme_layers(text) == [["kinds"], ["ir", "layout"]]
