#!/usr/bin/env python3
"""synth_gguf.py — writes a llama GGUF file with Llama-3.1-8B's attention and MLP geometry
(hidden 4096, 32 query heads, 8 KV heads, head dim 128, FFN 14336, rope base 500000) and few
layers, random F16 weights (fixed seed), and the tokenizer of another GGUF file (by default
stories260K's: a 512-token vocabulary, so that the output layer does not dominate the step).
Both kvworker and llama.cpp load it; bench/peer/run.sh compares them on it.

usage: synth_gguf.py OUT.gguf --tokenizer-from FILE.gguf [--layers N] [--seed S]
"""
import argparse
import sys

import numpy as np
import gguf

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336


def copy_tokenizer(reader, writer):
    """Every tokenizer.* key of reader, as it is; returns the vocabulary size."""
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        types = field.types
        if types[0] == gguf.GGUFValueType.ARRAY:
            vals = [field.parts[i] for i in field.data]
            if types[1] == gguf.GGUFValueType.STRING:
                vals = [bytes(v).decode("utf-8", errors="surrogateescape") for v in vals]
                writer.add_array(name, vals)
            else:
                writer.add_array(name, [v[0].item() for v in vals])
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        elif types[0] == gguf.GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            v = field.parts[field.data[0]][0].item()
            vt = types[0]
            if vt == gguf.GGUFValueType.BOOL:
                writer.add_bool(name, bool(v))
            elif vt in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
                writer.add_float32(name, float(v))
            else:
                writer.add_uint32(name, int(v))
    if not n_vocab:
        sys.exit("synth_gguf: no tokenizer.ggml.tokens in the tokenizer file")
    return n_vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer-from", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    reader = gguf.GGUFReader(a.tokenizer_from)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("synthetic llama-3.1-8b geometry")
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = copy_tokenizer(reader, w)
    w.add_vocab_size(n_vocab)

    def mat(rows, cols):
        # Scaled so that activations stay O(1) through the layers.
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, HIDDEN))
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(HIDDEN))
        w.add_tensor(p + "attn_q.weight", mat(HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_k.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_v.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_output.weight", mat(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", norm(HIDDEN))
        w.add_tensor(p + "ffn_gate.weight", mat(FFN, HIDDEN))
        w.add_tensor(p + "ffn_up.weight", mat(FFN, HIDDEN))
        w.add_tensor(p + "ffn_down.weight", mat(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", norm(HIDDEN))
    w.add_tensor("output.weight", mat(n_vocab, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
