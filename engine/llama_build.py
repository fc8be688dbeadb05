"""What the installed llama.cpp build is: the llama-cpp-python release whose internals the engine
uses, and one known crash to warn of on this CPU.

llama.cpp's AMX matrix multiply segfaults on the first prefill on Sapphire Rapids Xeons
(ggml-org/llama.cpp#20824, measured here with Gemma 3 270M and Qwen2.5 Q4_K_M). The project's
bootstrap builds without it; a llama-cpp-python built elsewhere may have it.
"""

from __future__ import annotations

from pathlib import Path

AMX_WARNING = ("llama.cpp was built with AMX on a CPU that has it: its AMX matrix multiply crashes on the first "
               "prefill on Sapphire Rapids Xeons (ggml-org/llama.cpp#20824); rebuild it without AMX: "
               "`make clean install` (scripts/bootstrap.sh builds with -mno-amx-*)")


# The engine reaches past llama-cpp-python's public API (its context object, per-sequence state,
# llama_memory_seq_*), measured with this release. pyproject.toml pins the same range.
LLAMA_CPP_RELEASE = (0, 3, 36)


def unsupported_llama_cpp(version: str) -> str | None:
    """Why an installed llama-cpp-python release cannot serve (None when it can): exactly the release
    the engine was written against (a local build's suffix, `+cu124`, aside). The engines use its
    internals (`Llama._ctx`, `_init_sampler` and its sampler defaults), which a patch release may move."""
    try:
        parts = tuple(int(p) for p in version.split("+")[0].split(".")[:3])
    except ValueError:
        return f"llama-cpp-python {version!r} is not a release number"
    if parts != LLAMA_CPP_RELEASE:
        wanted = ".".join(map(str, LLAMA_CPP_RELEASE))
        return (f"llama-cpp-python {version} is installed; the engine uses internals of =={wanted} "
                f"(pip install 'llama-cpp-python=={wanted}', or `make clean install`)")
    return None


def cpu_flags() -> str:
    """The `flags` line of /proc/cpuinfo ("" where there is none)."""
    try:
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return ""


def system_info() -> str:
    """llama.cpp's own account of the instruction sets it was built with ("" if unavailable)."""
    try:
        import llama_cpp

        return str(llama_cpp.llama_print_system_info().decode(errors="replace")).strip()
    except Exception:
        return ""


def amx_crash_risk(flags: str, build_info: str) -> bool:
    """A build whose AMX kernels are in (`AMX_INT8 = 1`) on a CPU that runs them."""
    return "amx_int8" in flags.split() and "AMX_INT8 = 1" in build_info
