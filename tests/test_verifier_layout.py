"""The Verifier's layout, read from its source: one subpackage per stage, each importing only the
stages before it (imports inside functions included), no module past ~600 lines, and no class whose
name another module of the package also uses (a reader who knows the name finds one class)."""

from __future__ import annotations

import ast
from pathlib import Path

import stitchcuda

PACKAGE = Path(stitchcuda.__file__).resolve().parent
VERIFIER = PACKAGE / "verifier"

#: The stages in order: a module may import its own stage and those before it.
LAYERS = ("static", "report", "measure", "run", "verification")
MAX_LINES = 600


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, at any depth."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            if not node.module:  # from . import x: x may be a module
                out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["stitchcuda", "verifier"] or len(parts) < 3:
        return None
    return LAYERS.index(parts[2]) if parts[2] in LAYERS else None


def _sources() -> list[Path]:
    return sorted(p for p in VERIFIER.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_stage_imports_only_the_stages_before_it():
    wrong = []
    for path in _sources():
        own = _layer(_module(path))
        if own is None:
            continue
        for line, target in _imports(path):
            other = _layer(target)
            if other is not None and other > own:
                wrong.append(f"{path.relative_to(VERIFIER)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_lower_stages_need_no_torch_at_import():
    """``static`` and ``report`` are read without PyTorch (a report, a rule id): no top-level torch import."""
    for path in _sources():
        own = _layer(_module(path))
        if own is None or LAYERS[own] not in ("static", "report"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names] + \
                [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "torch"], path


def test_no_module_is_longer_than_the_limit():
    long = [f"{p.relative_to(VERIFIER)}: {n}" for p in _sources()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, long


def test_the_verifiers_class_names_are_its_own():
    where: dict[str, list[str]] = {}
    for path in sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    clash = {name: files for name, files in where.items()
             if len(files) > 1 and any(f.startswith("verifier/") for f in files)}
    assert not clash, clash
