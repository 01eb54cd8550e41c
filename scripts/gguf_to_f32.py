#!/usr/bin/env python3
"""Write an F32 copy of a GGUF file: every tensor dequantized to float32, every metadata key
(tokenizer included) copied unchanged except general.file_type, which becomes ALL_F32.

kvworker loads F32/F16/BF16 GGUF files only; scripts/fetch-models.sh uses this to turn the
quantized SmolLM2 file into one it loads. Needs the `gguf` and `numpy` packages.

usage: gguf_to_f32.py IN.gguf OUT.gguf
"""
import os
import sys

import gguf
import numpy as np


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch is None:
        print(f"gguf_to_f32: {src}: no general.architecture", file=sys.stderr)
        return 1
    tmp = dst + ".tmp"
    writer = gguf.GGUFWriter(tmp, arch=arch.contents())
    for field in reader.fields.values():
        # GGUF.* are the reader's virtual fields; the writer adds the architecture itself.
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)

    for t in reader.tensors:
        # dequantize() returns the row-major array, shape reversed from GGUF's ne order; the
        # writer reverses it back, so the F32 tensor keeps the original ne.
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        want = tuple(int(n) for n in reversed(t.shape))
        if w.shape != want:
            w = w.reshape(want)
        writer.add_tensor(t.name, np.ascontiguousarray(w))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
