"""The house's layout rules: imports walk one way, no module outgrows one concept, and the runtime
package ships no training code or data splits.
Model: none (no model is loaded).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.test_policies_boundaries import imported_roots

ROOT = Path(__file__).resolve().parent.parent
# Lowest first: a package may import its own layer and those below it, never one above.
LAYERS = ("policies", "engine", "sessions", "gateway", "benchmarks")
MAX_LINES = 450


def _modules(top: str) -> list[Path]:
    # Hidden folders hold caches, not the project's code (benchmarks/.cache: the clients' own files).
    return sorted(p for p in (ROOT / top).rglob("*.py")
                  if "__pycache__" not in p.parts and not any(part.startswith(".") for part in p.relative_to(ROOT).parts))


def _runtime_packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["setuptools"]["packages"])


def test_imports_only_walk_down_the_layers() -> None:
    bad = []
    for rank, layer in enumerate(LAYERS):
        for path in _modules(layer):
            above = imported_roots(path) & set(LAYERS[rank + 1 :])
            if above:
                bad.append(f"{path.relative_to(ROOT)} imports {sorted(above)}")
    assert not bad, "\n".join(bad)


def test_no_module_outside_tests_over_450_lines() -> None:
    long = [f"{p.relative_to(ROOT)}: {n}" for top in (*LAYERS, "examples", "scripts")
            for p in _modules(top) if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, long


def test_the_runtime_package_holds_no_training_code_or_splits() -> None:
    packages = _runtime_packages()
    assert "engine.scoring" in packages and "engine.models" in packages
    assert not [p for p in packages if p.split(".")[0] not in LAYERS[:-1]], packages
    for package in packages:
        folder = ROOT / package.replace(".", "/")
        assert not list(folder.glob("splits*")), f"{package} ships data splits"
        for path in folder.glob("*.py"):
            assert not path.stem.endswith("_train"), f"{path.relative_to(ROOT)} is training code"
            assert "agent_data" not in path.stem
    # The shipped weights are the training's output, found where the scorers look.
    from engine.models.files import SHIPPED_HEAD, SHIPPED_RANKER

    assert SHIPPED_HEAD.is_file() and SHIPPED_RANKER.is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert not [g for globs in data.values() for g in globs if "split" in g], data


def test_the_layer_check_sees_lazy_imports(tmp_path: Path) -> None:
    """An import inside a function counts: the check catches gateway importing benchmarks late."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from benchmarks.training.splits import split_of\n")
    assert "benchmarks" in imported_roots(probe)
