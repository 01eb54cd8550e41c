# tests/quant.cmake — quantized weights (docs/quant.md): the block formats' reference, the CPU
# kernels, loading quantized GGUFs, and quantized models end to end.
freekv_add_test(test_quant SOURCES test_quant.c LIBS freekv_common LABELS unit)
freekv_add_test(test_cpu_quant SOURCES test_cpu_quant.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_model_quant SOURCES test_model_quant.c LIBS freekv_runtime LABELS unit)

# The reference dequantization as a shared library, for the Python check against the gguf
# package (ctypes).
add_library(freekv_quant_ref SHARED ${PROJECT_SOURCE_DIR}/common/quant.c ${PROJECT_SOURCE_DIR}/common/dtype.c)
freekv_target(freekv_quant_ref)
target_include_directories(freekv_quant_ref PRIVATE ${PROJECT_SOURCE_DIR}/common)
# stories260K as Q8_0 against F32 (greedy tokens, perplexity), with a venv holding gguf.
add_test(NAME test_quant_model
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_quant_model.sh ${PROJECT_SOURCE_DIR}
    ${PROJECT_BINARY_DIR} $<TARGET_FILE:kvworker> $<TARGET_FILE:freekv_quant_ref>)
set_tests_properties(test_quant_model PROPERTIES LABELS integration SKIP_RETURN_CODE 77 TIMEOUT 600)
# The real SmolLM2-135M Q4_1 file against its dequantized F32 copy (skipped when absent).
freekv_add_test(test_quant_smollm2 SOURCES test_quant_smollm2.c LIBS freekv_runtime
  LABELS slow TIMEOUT 900)
