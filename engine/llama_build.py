"""What the installed llama.cpp build does on this CPU: one known crash to warn of.

llama.cpp's AMX matrix multiply segfaults on the first prefill on Sapphire Rapids Xeons
(ggml-org/llama.cpp#20824, measured here with Gemma 3 270M and Qwen2.5 Q4_K_M). The project's
bootstrap builds without it; a llama-cpp-python built elsewhere may have it.
"""

from __future__ import annotations

from pathlib import Path

AMX_WARNING = ("llama.cpp was built with AMX on a CPU that has it: its AMX matrix multiply crashes on the first "
               "prefill on Sapphire Rapids Xeons (ggml-org/llama.cpp#20824); rebuild it without AMX: "
               "`make clean install` (scripts/bootstrap.sh builds with -mno-amx-*)")


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
