"""A float64 numpy reference for Llama-family GGUF models, written from the architecture and the
GGUF conventions, independent of kvworker's C code: it reads the file with the `gguf` package,
tokenizes with Hugging Face `tokenizers` built from the GGUF vocabulary, and computes logits,
greedy continuations and teacher-forced negative log-likelihoods.

Architecture (Llama): x = embedding[token]; per layer
    x += Wo · attention(RoPE(Wq · rms(x)), RoPE(Wk · rms(x)), Wv · rms(x))
    x += Wdown · (silu(Wgate · rms(x)) * Wup · rms(x))
then logits = Wout · rms(x), with Wout the embedding matrix when the file has no output.weight
(tied). rms(x) = x / sqrt(mean(x²) + eps) * w. Attention is causal, scaled by 1/sqrt(head_dim),
with grouped-query heads: query head h reads KV head h // (n_head / n_head_kv), as repeat_kv
does in the Hugging Face model.

RoPE: llama.cpp's converter permutes the rows of Q and K of a Hugging Face Llama checkpoint (whose
rotary embedding rotates the two halves of a head) so that a GGUF `llama` model rotates adjacent
pairs (x[2i], x[2i+1]) by pos * base^(-2i / n_rot) — ggml's "normal" rope mode. That is what is
applied here, to the first n_rot = rope.dimension_count dimensions of each head.

GGUF layout: a tensor with ne = (n_in, n_out) is stored row-major as n_out rows of n_in, which is
what GGUFReader returns as an (n_out, n_in) array, so y = W @ x.
"""
from __future__ import annotations

import math

import gguf
import numpy as np


class LlamaRef:
    def __init__(self, path: str):
        r = gguf.GGUFReader(path)
        self.reader = r
        arch = r.get_field("general.architecture").contents()
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch!r}, this reference knows llama only")

        def kv(key, default=None):
            f = r.get_field(f"{arch}.{key}")
            return f.contents() if f is not None else default

        self.n_layer = int(kv("block_count"))
        self.dim = int(kv("embedding_length"))
        self.n_head = int(kv("attention.head_count"))
        self.n_head_kv = int(kv("attention.head_count_kv", self.n_head))
        self.head_dim = self.dim // self.n_head
        self.n_rot = int(kv("rope.dimension_count", self.head_dim))
        self.theta = float(kv("rope.freq_base", 10000.0))
        self.eps = float(kv("attention.layer_norm_rms_epsilon"))
        if kv("rope.scaling.type") not in (None, "none"):
            raise ValueError(f"{path}: rope scaling is not modelled by this reference")

        t = {x.name: x for x in r.tensors}
        for x in t.values():
            if x.tensor_type != gguf.GGMLQuantizationType.F32:
                raise ValueError(f"{path}: tensor {x.name} is {x.tensor_type.name}; "
                                 "the reference reads F32 files (scripts/gguf_to_f32.py)")

        def w(name):
            return np.asarray(t[name].data, dtype=np.float64)

        self.embd = w("token_embd.weight")                     # (vocab, dim)
        self.out = w("output.weight") if "output.weight" in t else self.embd
        self.out_norm = w("output_norm.weight")
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            self.layers.append({k: w(p + k + ".weight") for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        self.vocab = self.embd.shape[0]
        self.tokens = r.get_field("tokenizer.ggml.tokens").contents()
        f = r.get_field("tokenizer.ggml.eos_token_id")
        self.eos = {int(f.contents())} if f is not None else set()
        f = r.get_field("tokenizer.ggml.bos_token_id")
        self.bos = int(f.contents()) if f is not None else None
        f = r.get_field("tokenizer.ggml.add_bos_token")
        self.add_bos = bool(f.contents()) if f is not None else False
        half = self.n_rot // 2
        self.inv_freq = self.theta ** (-2.0 * np.arange(half, dtype=np.float64) / self.n_rot)

    # ------------------------------------------------------------------ model

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):
        """x: (n, heads, head_dim); pairs (2i, 2i+1) of the first n_rot dims rotated."""
        ang = np.asarray(pos, dtype=np.float64)[:, None] * self.inv_freq[None, :]  # (n, half)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        y = x.copy()
        a, b = x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2]
        y[..., 0:self.n_rot:2] = a * c - b * s
        y[..., 1:self.n_rot:2] = a * s + b * c
        return y

    def new_cache(self):
        return [[np.zeros((0, self.n_head_kv, self.head_dim)),
                 np.zeros((0, self.n_head_kv, self.head_dim))] for _ in range(self.n_layer)]

    def forward(self, ids, cache):
        """Runs tokens ids after what cache holds; returns logits (len(ids), vocab)."""
        n = len(ids)
        p0 = cache[0][0].shape[0]
        pos = np.arange(p0, p0 + n)
        x = self.embd[np.asarray(ids)]                                   # (n, dim)
        group = self.n_head // self.n_head_kv
        scale = 1.0 / math.sqrt(self.head_dim)
        # causal mask: query i (position p0+i) sees keys 0..p0+i
        mask = np.arange(p0 + n)[None, :] > pos[:, None]                 # (n, p0+n)
        for L, c in zip(self.layers, cache):
            h = self._rms(x, L["attn_norm"])
            q = (h @ L["attn_q"].T).reshape(n, self.n_head, self.head_dim)
            k = (h @ L["attn_k"].T).reshape(n, self.n_head_kv, self.head_dim)
            v = (h @ L["attn_v"].T).reshape(n, self.n_head_kv, self.head_dim)
            q, k = self._rope(q, pos), self._rope(k, pos)
            c[0] = np.concatenate([c[0], k])
            c[1] = np.concatenate([c[1], v])
            K = np.repeat(c[0], group, axis=1)                           # (T, n_head, hd)
            V = np.repeat(c[1], group, axis=1)
            s = np.einsum("nhd,thd->hnt", q, K) * scale                  # (n_head, n, T)
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = np.einsum("hnt,thd->nhd", s, V).reshape(n, self.dim)
            x = x + o @ L["attn_output"].T
            h = self._rms(x, L["ffn_norm"])
            g = h @ L["ffn_gate"].T
            x = x + ((g / (1.0 + np.exp(-g))) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
        return self._rms(x, self.out_norm) @ self.out.T

    def greedy(self, prompt, n):
        """Up to n greedy tokens after prompt, stopping before an EOS (as kvworker does).
        Returns (tokens, margins): margins[i] is the top-1 minus top-2 logit of step i."""
        cache = self.new_cache()
        logits = self.forward(prompt, cache)[-1]
        out, margins = [], []
        while len(out) < n:
            top2 = np.argsort(logits)[-2:]
            nxt = int(top2[1])
            margins.append(float(logits[top2[1]] - logits[top2[0]]))
            if nxt in self.eos:
                break
            out.append(nxt)
            if len(out) == n:
                break
            logits = self.forward([nxt], cache)[0]
        return out, margins

    def nll(self, ids):
        """Teacher-forced -log p(ids[i] | ids[:i]) for i >= 1, in one causal pass."""
        logits = self.forward(ids[:-1], self.new_cache())
        m = logits.max(axis=-1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=-1)))
        return lse - logits[np.arange(len(ids) - 1), np.asarray(ids[1:])]

    # -------------------------------------------------------------- tokenizer

    def tokenizer(self):
        """A Hugging Face tokenizer built from the GGUF vocabulary and merges (byte-level BPE)."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        r = self.reader
        model = r.get_field("tokenizer.ggml.model").contents()
        pre = r.get_field("tokenizer.ggml.pre").contents()
        if model != "gpt2":
            raise ValueError(f"tokenizer model {model!r}: only byte-level BPE (gpt2) is built here")
        # llama.cpp's pre-tokenizer types; "smollm" (as "starcoder") splits every digit, then
        # applies the GPT-2 regex — Hugging Face's Digits(individual) + ByteLevel(use_regex).
        if pre in ("smollm", "starcoder", "refact"):
            pt = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        elif pre in ("gpt-2", "gpt2", "default"):
            pt = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            raise ValueError(f"pre-tokenizer {pre!r} is not modelled by this reference")
        vocab = {s: i for i, s in enumerate(self.tokens)}
        merges = [tuple(m.split(" ", 1)) for m in r.get_field("tokenizer.ggml.merges").contents()]
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
        tk.pre_tokenizer = pt
        tk.decoder = decoders.ByteLevel()
        types = r.get_field("tokenizer.ggml.token_type").contents()
        control = gguf.TokenType.CONTROL
        tk.add_special_tokens([AddedToken(self.tokens[i], special=True, normalized=False)
                               for i, ty in enumerate(types) if ty == control])
        return tk

    def encode(self, text, add_bos=True):
        """The prompt ids kvworker generate should use: BOS only when the model adds one."""
        if not hasattr(self, "_tk"):
            self._tk = self.tokenizer()
        ids = self._tk.encode(text, add_special_tokens=False).ids
        if add_bos and self.add_bos and self.bos is not None:
            ids = [self.bos] + ids
        return ids

    def decode(self, ids):
        if not hasattr(self, "_tk"):
            self._tk = self.tokenizer()
        return self._tk.decode(ids, skip_special_tokens=False)
