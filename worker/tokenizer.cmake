# worker/tokenizer.cmake — tokenizers: SentencePiece-style BPE (GGUF "llama", tokenizer.json with
# byte fallback) and byte-level BPE (tokenizer.json / GGUF "gpt2") with PCRE2 pre-tokenization
# (pretok.c); utf8proc for the NFC normalizer.
target_sources(freekv_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_load.c
  ${CMAKE_CURRENT_LIST_DIR}/pretok.c)
target_link_libraries(freekv_runtime PUBLIC PkgConfig::PCRE2 PkgConfig::JSONC PkgConfig::UTF8PROC)
