# tests/eval.cmake — `kvworker eval`, the accuracy harness, on stories260K over the shipped corpus
# (tests/data/stories_corpus.txt, made by scripts/make_corpus.sh). Runs the real binary.
freekv_add_test(test_eval SOURCES test_eval.c LIBS freekv_runtime PkgConfig::JSONC
  LABELS integration TIMEOUT 300)
add_dependencies(test_eval kvworker)
