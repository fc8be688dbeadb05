"""policies/ is the functional core: it imports no shell package and does no I/O.
Model: none (no model is loaded).
"""

from __future__ import annotations

import ast
from pathlib import Path

POLICIES = Path(__file__).resolve().parent.parent / "policies"
FORBIDDEN = {
    "gateway", "engine", "sessions",  # the shell
    "os", "io", "pathlib", "socket", "subprocess", "asyncio", "aiohttp", "requests", "httpx",
    "llama_cpp", "time", "random", "threading", "logging", "shutil", "tempfile",
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_policies_import_no_shell_and_no_io() -> None:
    files = sorted(POLICIES.glob("*.py"))
    assert len(files) >= 10
    for f in files:
        bad = imported_roots(f) & FORBIDDEN
        assert not bad, f"{f.name} imports {sorted(bad)}"


def test_no_builtin_io_calls() -> None:
    for f in sorted(POLICIES.glob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"open", "print", "input", "exec", "eval"}, f"{f.name}: {node.func.id}()"
