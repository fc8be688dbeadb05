"""Write a GGUF that keeps only a model's first N blocks: a cheaper drafter.

The drafter reads hidden states from a low layer and stops the graph there, so blocks above the
tap are dead weight in memory and load time. A truncated file keeps every metadata key (tokenizer
included) except `<arch>.block_count`, every non-block tensor (token embeddings, output norm,
output head if any) and the tensors of blocks 0..N-1 byte for byte, so layers below N compute
exactly what the full model computes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_BLOCK = re.compile(r"^blk\.(\d+)\.")


class TruncateError(ValueError):
    """The input cannot be truncated as asked; the message is one line for the terminal."""


def truncate_gguf(src: Path | str, dst: Path | str, blocks: int) -> dict[str, int]:
    """Copy `src` to `dst` keeping blocks 0..blocks-1; returns counts for a report.

    Written to a temporary name and renamed, so a failed run never leaves a half file at `dst`.
    """
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise TruncateError("output must differ from the input")
    reader = GGUFReader(str(src))
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise TruncateError(f"{src}: no general.architecture key")
    arch = str(arch_field.contents())
    count_key = f"{arch}.block_count"
    if count_key not in reader.fields:
        raise TruncateError(f"{src}: no {count_key} key")
    total = int(reader.fields[count_key].contents())
    if not 1 <= blocks <= total:
        raise TruncateError(f"blocks must be in 1..{total} for this model, got {blocks}")

    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    writer = GGUFWriter(str(tmp), arch)
    try:
        alignment = reader.fields.get("general.alignment")
        if alignment is not None:
            writer.data_alignment = int(alignment.contents())
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue  # header counters are recomputed; the writer adds the architecture itself
            vtype = GGUFValueType(int(field.types[0]))
            if name == count_key:
                writer.add_key_value(name, blocks, vtype)
                continue
            sub_type = None
            if vtype == GGUFValueType.ARRAY:
                sub_type = GGUFValueType(int(field.types[-1]))
                if len(field.types) > 2:
                    raise TruncateError(f"{src}: nested array key {name} is not supported")
            writer.add_key_value(name, field.contents(), vtype, sub_type=sub_type)
        kept = dropped = 0
        for tensor in reader.tensors:
            m = _BLOCK.match(tensor.name)
            if m is not None and int(m.group(1)) >= blocks:
                dropped += 1
                continue
            # Raw bytes (quantized) or plain arrays: the writer maps either back to ggml's shape.
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
            kept += 1
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, dst)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return {"blocks": blocks, "of_blocks": total, "tensors_kept": kept, "tensors_dropped": dropped,
            "bytes": dst.stat().st_size}


def run_make_drafter(src: Path, blocks: int, dst: Path) -> int:
    """`pflash-gateway make-drafter`: one summary line on success, one error line and 2 otherwise."""
    import sys

    if not src.is_file():
        print(f"pflash-gateway: model file not found: {src}", file=sys.stderr)
        return 2
    try:
        report = truncate_gguf(src, dst, blocks)
    except (TruncateError, OSError, ValueError) as exc:  # gguf raises ValueError on a malformed file
        print(f"pflash-gateway: make-drafter: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {dst}: {report['blocks']} of {report['of_blocks']} blocks, {report['tensors_kept']} tensors "
          f"({report['tensors_dropped']} dropped), {report['bytes'] / 1e6:.1f} MB")
    return 0
