"""The floor plan holds: the engine and media know no HTTP and no wire schema, models know no app and no
peer, and the HTTP layer is the only one that knows FastAPI besides the APIs and the composition root."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Folder -> installed package (pyproject.toml's package-dir).
PACKAGES = {"app": "mmencode.app", "models": "mmencode.models", "schemas": "mmencode.schemas"}
HTTP_FRAMEWORKS = ("fastapi", "starlette", "fastapi_offline", "uvicorn")


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    parts[0] = PACKAGES[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for folder in PACKAGES for path in (ROOT / folder).rglob("*.py")}


def _imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, at any level (functions' imports too)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _closure(start: str, modules: dict[str, Path]) -> set[str]:
    """The project modules ``start`` reaches through imports."""
    seen, queue = set(), [start]
    while queue:
        name = queue.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        queue.extend(_imports(modules[name]))
    return seen


def _in(package: str, name: str) -> bool:
    return name == package or name.startswith(package + ".")


MODULES = _modules()
CORE = sorted(name for name in MODULES if _in("mmencode.app.engine", name) or _in("mmencode.app.media", name))


@pytest.mark.parametrize("name", CORE)
def test_the_engine_and_media_know_no_http_and_no_wire_schema(name: str) -> None:
    reached = _closure(name, MODULES)
    outside = sorted(
        other
        for other in reached
        if any(_in(f"mmencode.app.{wing}", other) for wing in ("api", "http", "peers", "server"))
        or _in("mmencode.schemas", other)
    )
    assert not outside, f"{name} reaches {outside}"
    frameworks = sorted(
        f"{other} imports {imported}"
        for other in reached
        for imported in _imports(MODULES[other])
        if imported.split(".")[0] in HTTP_FRAMEWORKS
    )
    assert not frameworks, frameworks


def _identifiers(path: Path) -> Iterator[tuple[int, str]]:
    """Names in code (not comments or docstrings): variables, attributes, definitions, arguments, imports."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.lineno, node.name
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg
        elif isinstance(node, ast.keyword) and node.arg is not None:
            yield node.value.lineno, node.arg
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            yield node.lineno, node.module


@pytest.mark.parametrize("name", sorted(name for name in MODULES if _in("mmencode.models", name)))
def test_models_import_no_app_and_name_no_peer(name: str) -> None:
    path = MODULES[name]
    assert not [imported for imported in _imports(path) if _in("mmencode.app", imported)]
    # A peer's own frame choice reaches an adapter as a models.base.FrameChoice, from app/peers.
    named = [f"{path.name}:{line} {identifier}" for line, identifier in _identifiers(path)
             if "vllm" in identifier.lower() or "sglang" in identifier.lower()]  # fmt: skip
    assert not named, named


def test_fastapi_is_known_to_the_http_layer_the_apis_and_the_composition_root_only() -> None:
    allowed = ("mmencode.app.http", "mmencode.app.api", "mmencode.app.server", "mmencode.app.cli")
    users = sorted(
        name
        for name, path in MODULES.items()
        if any(imported.split(".")[0] in HTTP_FRAMEWORKS for imported in _imports(path))
        and not any(_in(prefix, name) for prefix in allowed)
    )
    assert not users, users


def test_the_benchmarks_import_nothing_from_the_tests() -> None:
    """Tests build on bench/ (its client, media and peer servers), never the other way round."""
    offenders = {
        str(path.relative_to(ROOT)): sorted({name for name in _imports(path) if name.split(".")[0] == "tests"})
        for path in (ROOT / "bench").rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}
