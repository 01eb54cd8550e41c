# tests/tokenizer.cmake — tokenizers: stories260K GGUF vs tokenizer.json vs SentencePiece ids, a
# naive BPE reference, a hand-written byte-level tokenizer, malformed files.
freekv_add_test(test_tokenizer SOURCES test_tokenizer.c LIBS freekv_runtime PkgConfig::JSONC LABELS unit)
