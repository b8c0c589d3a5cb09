"""docs/architecture.md must stay true: every module has a row in its map, and imports go the way it says."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("core", "lm", "world_models", "domains", "sdk", "bench")
SANDBOX = "domains/autoresearch/sandbox/"


def modules() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            trivial = path.name == "__init__.py" and all(isinstance(n, ast.Expr) for n in tree.body)
            if not trivial:  # a package's one-line docstring is not a module worth a row
                out.append(path.relative_to(ROOT).as_posix())
    return out


def layer(module: str) -> str:
    """The layer of a dotted wmrl module name, or of a repository path."""
    parts = module.replace("/", ".").removesuffix(".py").split(".")
    if parts[0] == "wmrl":
        parts = parts[1:] if parts[1:2] and parts[1] in ("core", "lm", "world_models", "domains", "bench") else ["sdk"]
    if parts[0] == "domains" and len(parts) > 1:
        return "sandbox" if parts[1:3] == ["autoresearch", "sandbox"] else f"domains.{parts[1]}"
    return parts[0]


def wmrl_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return [n for n in names if n == "wmrl" or n.startswith("wmrl.")]


def allowed(src: str, dst: str, path: str) -> bool:
    if src == "core":
        return dst == "core"
    if src == "lm":
        return dst in ("core", "lm")
    if src == "world_models":
        return dst in ("core", "lm", "world_models")
    if src == "sandbox":
        return dst == "sandbox"
    if src.startswith("domains."):
        return dst in ("core", "lm", "world_models", src) or (src == "domains.autoresearch" and dst == "sandbox")
    if src == "sdk":  # domains only through the registries; benchmarks only from the command that runs them
        return not dst.startswith("domains") and (dst != "bench" or path == "sdk/cli.py")
    return True  # bench sits on top


def test_every_module_has_a_row_in_the_map():
    rows = set(re.findall(r"^\| `([\w/.]+\.py)` \|", DOC.read_text(), re.M))
    missing = sorted(set(modules()) - rows)
    stale = sorted(rows - set(modules()))
    assert not missing, f"{DOC.name} lacks a row for {missing}"
    assert not stale, f"{DOC.name} lists modules that do not exist: {stale}"


@pytest.mark.parametrize("path", modules())
def test_imports_go_the_way_the_map_says(path):
    src = layer(path)
    wrong = [m for m in wmrl_imports(ROOT / path) if not allowed(src, layer(m), path)]
    assert not wrong, f"{path} ({src}) imports {wrong}, against {DOC.name}"


def test_the_layer_rule_itself_refuses_the_imports_it_should():
    assert not allowed("core", "sdk", "core/x.py") and not allowed("core", "domains.synthetic", "core/x.py")
    assert not allowed("world_models", "domains.autoresearch", "world_models/x.py")
    assert not allowed("lm", "world_models", "lm/x.py") and not allowed("core", "lm", "core/x.py")
    assert not allowed("domains.synthetic", "domains.autoresearch", "domains/synthetic/x.py")
    assert not allowed("sandbox", "core", SANDBOX + "x.py")
    assert not allowed("sdk", "bench", "sdk/api.py") and allowed("sdk", "bench", "sdk/cli.py")
    assert layer("wmrl.config") == "sdk" and layer("wmrl.domains.autoresearch.sandbox.pool") == "sandbox"


def test_the_public_surface_exports_what_the_interfaces_exchange():
    import wmrl

    for name in ("Task", "Transition", "Trajectory", "Outcome", "Prediction", "Group", "Estimate", "SPLITS",
                 "build_trainer", "Trainer", "WorldModelConfig", "RuntimeConfig", "register_benchmark",
                 "Policy", "RealEnv", "WorldModel", "RewardEstimator", "Domain"):
        assert name in wmrl.__all__ and hasattr(wmrl, name), name
    assert sorted(wmrl.__all__) == sorted(set(wmrl.__all__))
    assert all(hasattr(wmrl, name) for name in wmrl.__all__)
