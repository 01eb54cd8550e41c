# tests/tokenizer.cmake — tokenizers: stories260K GGUF vs tokenizer.json vs SentencePiece ids and
# a naive BPE reference (test_tokenizer); a hand-written byte-level tokenizer, NFC, malformed
# files (test_tokenizer_bytelevel); every GGUF pre-tokenizer name and tokenizer.json
# pre-tokenizer vs Hugging Face's ids (test_pretok, offline on committed ids; test_pretok_hf
# regenerates them with HF tokenizers in a venv and diffs).
freekv_add_test(test_tokenizer SOURCES test_tokenizer.c LIBS freekv_runtime PkgConfig::JSONC LABELS unit)
freekv_add_test(test_tokenizer_bytelevel SOURCES test_tokenizer_bytelevel.c
  LIBS freekv_runtime PkgConfig::JSONC LABELS unit)
freekv_add_test(test_pretok SOURCES test_pretok.c LIBS freekv_runtime PkgConfig::JSONC LABELS unit)
add_test(NAME test_pretok_hf COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/pretok/check_hf.sh
  ${PROJECT_BINARY_DIR}/pretok-venv ${PROJECT_SOURCE_DIR})
set_tests_properties(test_pretok_hf PROPERTIES LABELS slow SKIP_RETURN_CODE 77 TIMEOUT 600)
