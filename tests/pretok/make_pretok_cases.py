#!/usr/bin/env python3
"""Test data for tests/test_pretok.c: token ids from Hugging Face `tokenizers`.

Three commands:

  extract LLAMA_VOCAB_CPP OUT
      Reads llama.cpp's src/llama-vocab.cpp (as shipped, e.g., in the llama-cpp-python sdist)
      and writes, for every tokenizer.ggml.pre name that maps to a byte-level BPE pre-tokenizer,
      its regex stages and flags (ignore_merges, add_bos). This is the independent side of the
      check: the C table in worker/pretok.c is written by hand, this list is read mechanically.

  cases PRE_JSON OUT
      Builds a byte-level BPE vocabulary (a small deterministic trainer, below), and for each
      distinct pre-tokenizer of PRE_JSON a tokenizer.json (HF Sequence of Split(Regex, Isolated)
      stages + ByteLevel(use_regex=false)), then encodes a fixed text with HF tokenizers and
      writes the ids. Also HF tokenizer.json pre-tokenizers the GGUF names do not cover (Split
      behaviours, invert, String patterns, Digits, ByteLevel options, Metaspace) with their ids.

  check PRE_JSON CASES_JSON
      Recomputes `cases` and compares with the committed file: exit 0 when equal, 1 otherwise.

Needs `tokenizers` only for `cases` and `check`.
"""
import ast
import json
import os
import re
import sys
from collections import Counter

# ---- extract ----

# Two llama.cpp pre types are custom splitters keyed by a placeholder regex; the regex their
# models ship stands in (worker/pretok.c says the same).
OVERRIDES = {
    # Kimi K2's tiktoken pattern; "[...&&[^\p{Han}]]" written as a lookahead (no && in PCRE2).
    "\\p{Han}+": (
        "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*"
        "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
        "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])+"
        "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
        "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    ),
    # AFMoE: a run of digits cut into threes from the right.
    "\\p{AFMoE_digits}": "\\p{N}{1,3}(?=(?:\\p{N}{3})*(?!\\p{N}))",
}

def strip_comments(src):
    """C++ source without // and /* */ comments, string literals kept intact."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if c == '"':
            j = i + 1
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        elif src.startswith("//", i):
            i = src.index("\n", i)
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        elif re.match(r"'(\\.|[^\\'])'", src[i:i + 4]):  # a char literal such as '"'
            j = src.index("'", i + 2 if src[i + 1] == "\\" else i + 1)
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def c_strings(text):
    return [ast.literal_eval('"' + s + '"') for s in re.findall(r'"((?:[^"\\]|\\.)*)"', text)]


def extract(cpp_path, out_path):
    src = strip_comments(open(cpp_path, encoding="utf-8").read())
    body = src[src.index("struct llm_tokenizer_bpe : llm_tokenizer"):]
    body = body[:body.index("std::vector<std::string> regex_exprs;")]
    regexes, not_bytes = {}, set()
    for block in body.split("break;"):
        types = re.findall(r"case LLAMA_VOCAB_PRE_TYPE_(\w+):", block)
        if re.search(r"\bdefault:", block):
            types.append("DEFAULT")
        m = re.search(r"regex_exprs = \{(.*?)\};", block, re.S)
        if not types or not m:
            continue
        stages = [OVERRIDES.get(s, s) for s in c_strings(m.group(1))]
        for t in types:
            regexes[t] = stages
            if "byte_encode = false" in block:
                not_bytes.add(t)
    load = src[src.index("void llama_vocab::impl::load("):]
    load = load[load.index("if (type == LLAMA_VOCAB_TYPE_BPE)"):]
    load = load[:load.index("unknown pre-tokenizer type")]
    names = {}
    for branch in load.split("} else if (")[1:]:
        found = re.findall(r'tokenizer_pre == "([^"]+)"', branch)
        t = re.search(r"pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", branch).group(1)
        for name in found:
            names[name] = {
                "type": t,
                "ignore_merges": "ignore_merges = true" in branch,
                "add_bos": "add_bos = true" in branch,
            }
    m = re.search(r"(.*llama_cpp_python-([\d.]+))/vendor/(.*)", cpp_path)
    source = cpp_path
    if m:  # the sdist carries the llama.cpp submodule's git dir: name its commit
        head = f"{m.group(1)}/.git/modules/vendor/llama.cpp/HEAD"
        commit = open(head).read().strip()[:12] if os.path.exists(head) else "?"
        source = f"llama-cpp-python {m.group(2)} sdist: vendor/{m.group(3)} (llama.cpp {commit})"
    out = {"source": source, "names": {}, "left_out": {}}
    for name, info in sorted(names.items()):
        t = info["type"]
        if t in not_bytes:
            out["left_out"][name] = f"{t}: not byte-level in llama.cpp (byte_encode = false)"
            continue
        out["names"][name] = dict(info, stages=regexes.get(t, regexes["DEFAULT"]))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(out['names'])} byte-level names, {len(out['left_out'])} left out")


# ---- vocabularies ----

TEXT = (
    "Hello World! The tokenizer's inference runs fast. I'LL say it's 'S time; we've, they'RE, don't.\n"
    "Don'tcha know rock'n'roll?\n"
    "HelloWorld getHTTPResponse XMLHttpRequest camelCase snake_case __init__\n"
    "def f(x):\n\treturn x**2 + 1  # comment\r\n"
    "if (a != b && c <= d) { y = a->b; } $HOME ~/path `code` <sentinel:12> IMGIMGBAZ\n"
    "Numbers: 1234567890 3.14159 12,345 007 \u00bd \u00b2 9876543210123\n"
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca\u3001"
    "\u4e2d\u6587\u5206\u8bcd\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 "
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0939\u093f\u0928\u094d\u0926\u0940 "
    "caf\u00e9 na\u00efve e\u0301\n"
    "Full-width\uff1a\uff08\uff54\uff45\uff53\uff54\uff09\uff01 ideographic\u3000space\u2026 "
    "Arabic\u060c comma\n"
    "Emoji \U0001f44b\U0001f3fd \U0001f1eb\U0001f1f7 \U0001f642!!\n\n"
    "  two spaces,     five spaces,\t\ttabs,                  eighteen spaces\n"
    "\n\n\nthree newlines\r\n\r\nand trailing spaces   "
)

CORPUS_EXTRA = (
    "The quick brown fox jumps over the lazy dog. It's the tokenizer that splits the text.\n"
    "for (int i = 0; i < n; i++) { total += values[i] * 2; }\n"
    "In 2024, 1,234,567 people paid $3.50 for 12 items; 100% of them said 'OK'.\n"
    "    indented code\n\tx = 42\n\n"
    "\u65e5\u672c\u8a9e \u4e2d\u6587 \u65e5\u672c \ud55c\uad6d\uc5b4 caf\u00e9\n"
    "\u65e5\u672c\u8a9e\u306e\u672c \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 "
    "\u65e5\u672c\u8a9e\u306e\u3068\n"
)

# Words of TEXT added whole to the byte vocabulary when the merges do not build them: only
# ignore_merges then gives them as one token.
WHOLE_WORDS = ["\u0120fast", "\u0120newlines", "\u0120trailing", "\u0120comment"]
N_MERGES = 700


def byte_table():
    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def train(words, n_merges, tokens):
    """Greedy BPE: merge the most frequent adjacent pair (ties: the smallest pair) n times."""
    words = Counter(tuple(w) for w in words)
    merges, known = [], set(tokens)
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        if best[0] + best[1] not in known:
            known.add(best[0] + best[1])
            tokens.append(best[0] + best[1])
        nw = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] += c
        words = nw
    return merges


def chunks(text):
    """Training words: runs of non-space with their leading space, whitespace runs, and a
    character with the whitespace beside it. They hold digits, punctuation, contractions and
    line ends together, so the merges cross the cuts of most pre-tokenizers and which of them
    apply depends on where a pre-tokenizer cuts."""
    return re.findall(r" ?\S+|\s+", text) + re.findall(r"\S\s+|\s+\S", text)


def byte_vocab():
    """Byte-level: the 256 byte symbols, then merges."""
    table = byte_table()
    tokens = [table[b] for b in range(256)]
    words = ["".join(table[b] for b in w.encode()) for w in chunks(TEXT + CORPUS_EXTRA)]
    merges = train(words, N_MERGES, tokens)
    tokens += [w for w in WHOLE_WORDS if w not in tokens]
    return tokens, merges


def meta_vocab():
    """SentencePiece-style for Metaspace: characters, merges learnt on ▁-words, byte fallback
    for what the corpus lacks (emoji are left out on purpose)."""
    text = re.sub("[\U0001f000-\U0001ffff]", "", TEXT + CORPUS_EXTRA).replace(" ", "\u2581")
    tokens = ["<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += sorted(set(text) - set(tokens))
    words = [w for w in re.split("(?=\u2581)", text) if w]
    merges = train(words, 300, tokens)
    return tokens, merges


# ---- cases ----

def bpe_json(tokens, merges, ignore_merges=False, byte_fallback=False, unk=None):
    return {
        "type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
        "end_of_word_suffix": None, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
        "ignore_merges": ignore_merges, "vocab": {t: i for i, t in enumerate(tokens)},
        "merges": [list(m) for m in merges],
    }


def hf_ids(model, pre_tokenizer, text):
    """Ids from HF for a tokenizer.json with this model and pre-tokenizer, and the
    pre-tokenizer as HF serialises it (what the C test feeds its loader)."""
    from tokenizers import Tokenizer
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
          "normalizer": None, "pre_tokenizer": pre_tokenizer, "post_processor": None,
          "decoder": None, "model": model}
    tok = Tokenizer.from_str(json.dumps(tj))
    return tok.encode(text, add_special_tokens=False).ids, json.loads(tok.to_str())["pre_tokenizer"]


def split(pattern, behavior="Isolated", invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern},
            "behavior": behavior, "invert": invert}


def seq(*pts):
    return {"type": "Sequence", "pretokenizers": list(pts)}


def bytelevel(add_prefix_space=False, use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def digits(individual):
    return {"type": "Digits", "individual_digits": individual}


def metaspace(scheme="always", split_=True, replacement="\u2581"):
    return {"type": "Metaspace", "replacement": replacement, "prepend_scheme": scheme,
            "split": split_}


# Pre-tokenizers no GGUF name uses, each checked on its own vocabulary ("byte" or "meta").
JSON_CASES = [
    ("Digits individual + ByteLevel regex", "byte", seq(digits(True), bytelevel(False, True))),
    ("Digits runs + ByteLevel regex", "byte", seq(digits(False), bytelevel(False, True))),
    ("ByteLevel prefix space + regex", "byte", bytelevel(True, True)),
    ("Split ' ' MergedWithNext + ByteLevel prefix per piece", "byte",
     seq(split(" ", "MergedWithNext", literal=True), bytelevel(True, False))),
    ("Split ' ' Removed", "byte", seq(split(" ", "Removed", literal=True), bytelevel())),
    ("Split \\s+ MergedWithPrevious", "byte", seq(split("\\s+", "MergedWithPrevious"), bytelevel())),
    ("Split \\p{P} Contiguous", "byte", seq(split("\\p{P}", "Contiguous"), bytelevel())),
    ("Split \\p{L}+ Isolated inverted", "byte", seq(split("\\p{L}+", invert=True), bytelevel())),
    ("Split \\s Removed inverted", "byte", seq(split("\\s", "Removed", invert=True), bytelevel())),
    ("Split \\d MergedWithNext inverted", "byte",
     seq(split("\\d", "MergedWithNext", invert=True), bytelevel())),
    ("Split empty String", "byte", seq(split("", literal=True), bytelevel(False, True))),
    ("Split String '->' Isolated", "byte", seq(split("->", literal=True), bytelevel(False, True))),
    ("Split (?=\\p{Lu}) empty matches", "byte", seq(split("(?=\\p{Lu})"), bytelevel())),
    ("Split \\d* empty and non-empty matches", "byte", seq(split("\\d*"), bytelevel())),
    ("Metaspace always split", "meta", metaspace("always", True)),
    ("Metaspace first split", "meta", metaspace("first", True)),
    ("Metaspace never split", "meta", metaspace("never", True)),
    ("Metaspace always unsplit", "meta", metaspace("always", False)),
    ("Metaspace replacement _", "meta", metaspace("always", True, "_")),
    ("Digits + Metaspace always (prefix per piece)", "meta", seq(digits(True), metaspace("always"))),
    ("Split \\n + Metaspace first", "meta", seq(split("\\n"), metaspace("first"))),
    ("Metaspace + ByteLevel", "byte", seq(metaspace("always"), bytelevel())),
]


def make_cases(pre_path):
    import tokenizers
    pre = json.load(open(pre_path, encoding="utf-8"))
    btok, bmerges = byte_vocab()
    mtok, mmerges = meta_vocab()
    configs, names = [], {}
    for name, info in sorted(pre["names"].items()):
        key = (tuple(info["stages"]), info["ignore_merges"])
        idx = next((i for i, c in enumerate(configs) if c["key"] == key), None)
        if idx is None:
            pt = seq(*[split(s) for s in info["stages"]], bytelevel())
            ids, pt = hf_ids(bpe_json(btok, bmerges, info["ignore_merges"]), pt, TEXT)
            configs.append({"key": key, "stages": info["stages"],
                            "ignore_merges": info["ignore_merges"], "pre_tokenizer": pt,
                            "ids": ids})
            idx = len(configs) - 1
        names[name] = {"config": idx, "add_bos": info["add_bos"]}
    for c in configs:
        del c["key"]
    for a in configs:  # else the vocabulary would not show that ignore_merges is applied
        for b in configs:
            if a["stages"] == b["stages"] and a["ignore_merges"] != b["ignore_merges"]:
                assert a["ids"] != b["ids"], "ignore_merges changes nothing on TEXT"
    cases = []
    for what, vocab, pt in JSON_CASES:
        model = (bpe_json(btok, bmerges) if vocab == "byte" else
                 bpe_json(mtok, mmerges, byte_fallback=True, unk="<unk>"))
        ids, pt = hf_ids(model, pt, TEXT)
        cases.append({"what": what, "vocab": vocab, "pre_tokenizer": pt, "ids": ids})
    return {
        "generator": "tests/pretok/make_pretok_cases.py",
        "tokenizers": tokenizers.__version__,
        "llama_cpp": pre["source"],
        "text": TEXT,
        "byte_vocab": {"tokens": btok, "merges": [list(m) for m in bmerges]},
        "meta_vocab": {"tokens": mtok, "merges": [list(m) for m in mmerges]},
        "configs": configs,
        "names": names,
        "json_cases": cases,
    }


def dump(obj, f):
    json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"), sort_keys=True)
    f.write("\n")


def main(argv):
    if len(argv) == 4 and argv[1] == "extract":
        extract(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "cases":
        with open(argv[3], "w", encoding="utf-8") as f:
            dump(make_cases(argv[2]), f)
    elif len(argv) == 4 and argv[1] == "check":
        import tokenizers
        want = json.load(open(argv[3], encoding="utf-8"))
        got = json.loads(json.dumps(make_cases(argv[2]), ensure_ascii=False))
        got["tokenizers"] = want["tokenizers"]  # a newer tokenizers must give the same ids
        bad = [k for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)]
        for k in bad:
            if k == "configs":
                for i, (a, b) in enumerate(zip(want[k], got[k])):
                    if a != b:
                        print(f"configs[{i}] ({a['stages'][0][:40]}...): ids differ")
            elif k == "json_cases":
                for a, b in zip(want[k], got[k]):
                    if a != b:
                        print(f"json case {a['what']!r}: ids differ")
            else:
                print(f"{k}: differs")
        print(f"{len(want['configs'])} GGUF configs, {len(want['json_cases'])} tokenizer.json "
              f"cases: {'equal' if not bad else 'DIFFERENT'} (tokenizers {tokenizers.__version__})")
        return 1 if bad else 0
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
