# tests/model.cmake — model loading: GGUF reader, safetensors reader, model_load (GGUF vs HF,
# config errors, fingerprint) and the synthetic-model writer.
freekv_add_test(test_gguf SOURCES test_gguf.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_gguf_large SOURCES test_gguf_large.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_safetensors SOURCES test_safetensors.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_model SOURCES test_model.c LIBS freekv_runtime PkgConfig::JSONC LABELS unit)
freekv_add_test(test_synth SOURCES test_synth.c LIBS freekv_runtime PkgConfig::JSONC LABELS unit)
