#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = []
# ///
"""t0_artifact reference solution: the job script a good agent submits (standard library only).

Reads every *.safetensors shard of the base model, and writes /data/outputs/model.safetensors
with every tensor unchanged except `model.norm.weight`, multiplied by 2 exactly in its own dtype
(for F16/BF16/F32/F64 that is adding one to the exponent; no rounding happens).

    python3 reference_solution.py [BASE_DIR [OUTPUTS_DIR]]    defaults: /base_model /data/outputs

An agent submits one self-contained script, so this file repeats the few lines of safetensors
reading and doubling that tasks/evaluator_kit.py holds for the evaluator; the tests check the two
against each other.
"""

import json
import os
import struct
import sys
from pathlib import Path

BASE_DIR = Path("/base_model")
OUTPUTS_DIR = Path("/data/outputs")
DOUBLED = "model.norm.weight"
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2}
SIZES |= {"BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
# bytes, exponent bits, mantissa bits
FLOATS = {"F16": (2, 5, 10), "BF16": (2, 8, 7), "F32": (4, 8, 23), "F64": (8, 11, 52)}
WORDS = {2: "H", 4: "I", 8: "Q"}  # struct codes of unsigned words of each width
CHUNK = 4 << 20


def read_header(path: Path) -> tuple[dict, int]:
    """A file's tensor entries and where its data section starts."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def double(dtype: str, data: bytes) -> bytes:
    """Each element × 2 exactly: exponent + 1; subnormals shift; overflow to inf; inf/NaN kept."""
    width, exp_bits, mant_bits = FLOATS[dtype]
    fmt = f"<{len(data) // width}{WORDS[width]}"
    exp_max = (1 << exp_bits) - 1
    out = []
    for word in struct.unpack(fmt, data):
        sign = word & (1 << (exp_bits + mant_bits))
        mag = word ^ sign
        exponent = mag >> mant_bits
        if exponent == exp_max:
            out.append(word)
        elif exponent == 0:
            out.append(sign | (mag << 1))
        elif exponent + 1 == exp_max:
            out.append(sign | (exp_max << mant_bits))
        else:
            out.append(sign | (mag + (1 << mant_bits)))
    return struct.pack(fmt, *out)


def main(argv: list[str]) -> int:
    base_dir = Path(argv[1]) if len(argv) > 1 else BASE_DIR
    out_dir = Path(argv[2]) if len(argv) > 2 else OUTPUTS_DIR
    shards = sorted(base_dir.glob("*.safetensors"))
    if not shards:
        print(f"no .safetensors files in {base_dir}", file=sys.stderr)
        return 1
    tensors = {}  # name -> (dtype, shape, file, absolute begin, absolute end)
    for shard in shards:
        header, start = read_header(shard)
        for name, entry in header.items():
            if name in tensors:
                print(f"{name} is in two shards", file=sys.stderr)
                return 1
            begin, end = entry["data_offsets"]
            tensors[name] = (entry["dtype"], entry["shape"], shard, start + begin, start + end)
    if DOUBLED not in tensors or tensors[DOUBLED][0] not in FLOATS:
        print(f"the base model has no floating-point {DOUBLED}", file=sys.stderr)
        return 1

    names = sorted(tensors)
    header, offset = {}, 0
    for name in names:
        dtype, shape, _, begin, end = tensors[name]
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + end - begin],
        }
        offset += end - begin
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes, as safetensors does

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.safetensors"
    partial = out_dir / "model.safetensors.partial"
    with open(partial, "wb") as out:
        out.write(struct.pack("<Q", len(raw)) + raw)
        for name in names:
            dtype, _, shard, begin, end = tensors[name]
            with open(shard, "rb") as f:
                f.seek(begin)
                if name == DOUBLED:
                    out.write(double(dtype, f.read(end - begin)))
                    continue
                left = end - begin
                while left:
                    chunk = f.read(min(left, CHUNK))
                    if not chunk:
                        raise OSError(f"{shard} ends inside {name}")
                    out.write(chunk)
                    left -= len(chunk)
    os.replace(partial, target)
    print(f"wrote {target}: {len(names)} tensors from {len(shards)} file(s), {DOUBLED} doubled")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
