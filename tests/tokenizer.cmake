# tests/tokenizer.cmake — tokenizers: stories260K GGUF vs tokenizer.json vs SentencePiece ids and
# a naive BPE reference (test_tokenizer); a hand-written byte-level tokenizer, NFC, malformed
# files (test_tokenizer_bytelevel).
freekv_add_test(test_tokenizer SOURCES test_tokenizer.c LIBS freekv_runtime PkgConfig::JSONC LABELS unit)
freekv_add_test(test_tokenizer_bytelevel SOURCES test_tokenizer_bytelevel.c
  LIBS freekv_runtime PkgConfig::JSONC LABELS unit)
