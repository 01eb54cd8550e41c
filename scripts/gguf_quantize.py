#!/usr/bin/env python3
"""gguf_quantize — rewrite a GGUF with its matrices in a ggml block format, using the `gguf`
Python package (ggml's own quantizers, written in numpy); metadata and every other tensor are
copied as they are. Used by tests/test_quant_model.sh (stories260K to Q8_0) and
bench/peer/run.sh. 1-D tensors (norms, biases, rope_freqs) stay as they are, as llama.cpp's
quantize leaves them; a matrix whose rows are not whole blocks of the format stays as it is
too (--fallback names a format to use for those instead).

  gguf_quantize.py SRC DST TYPE [--fallback TYPE]     TYPE: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16

  gguf_quantize.py --check-dequant LIB                  the C reference (a shared library with
      quant_dequant, built by the test) against gguf's dequantize on random blocks, bit for bit
"""
import ctypes
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T


def quantize_file(src, dst, qtype, fallback=None):
    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vt, sub_type=sub)
    counts = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # row-major (rows, cols)
        if t.tensor_type in (T.F32, T.F16, T.BF16) and len(shape) == 2:
            data = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
            use = qtype
            bs = gguf.GGML_QUANT_SIZES[use][0]
            if shape[1] % bs:
                use = fallback if fallback is not None else t.tensor_type
            q = gguf.quants.quantize(data, use) if use not in (T.F32,) else data
            w.add_tensor(t.name, q, raw_dtype=use)
            counts[use.name] = counts.get(use.name, 0) + 1
        else:
            w.add_tensor(t.name, np.array(t.data), raw_shape=shape, raw_dtype=t.tensor_type)
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("gguf_quantize: %s -> %s: %s" % (src, dst, ", ".join("%d %s" % (n, k) for k, n in sorted(counts.items()))))


FORMATS = [("Q8_0", 8), ("Q4_0", 2), ("Q4_1", 3), ("Q5_0", 6), ("Q5_1", 7), ("Q4_K", 12), ("Q5_K", 13),
           ("Q6_K", 14)]


def check_dequant(lib_path):
    lib = ctypes.CDLL(lib_path)
    rng = np.random.default_rng(21)
    bad = 0
    for name, tid in FORMATS:
        be, bb = gguf.GGML_QUANT_SIZES[T(tid)]
        nb = 256
        blk = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
        # finite f16 scales (d, m / dmin) where the layout has them (docs/quant.md)
        sc = (rng.standard_normal((nb, 2)) * 0.1).astype(np.float16).view(np.uint8).reshape(nb, 4)
        if name == "Q6_K":
            blk[:, 208:210] = sc[:, :2]
        elif name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
            blk[:, 0:4] = sc
        else:
            blk[:, 0:2] = sc[:, :2]
        ref = gguf.quants.dequantize(blk.reshape(-1), T(tid)).astype(np.float32).reshape(-1)
        out = np.full(nb * be, np.nan, dtype=np.float32)
        lib.quant_dequant(ctypes.c_int(tid), out.ctypes.data_as(ctypes.c_void_p),
                          blk.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(nb * be))
        same = np.array_equal(out.view(np.uint32), ref.view(np.uint32))
        print("check-dequant %s: %s" % (name, "bit-equal to gguf.quants.dequantize" if same else "DIFFERS"))
        bad += not same
    return 1 if bad else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--check-dequant":
        return check_dequant(argv[2])
    if len(argv) not in (4, 6) or (len(argv) == 6 and argv[4] != "--fallback"):
        sys.stderr.write(__doc__)
        return 2
    fallback = T[argv[5]] if len(argv) == 6 else None
    quantize_file(argv[1], argv[2], T[argv[3]], fallback)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
