# tests/engine.cmake — CPU backend ops (KIVI ops too), engine (float64 reference), sampler, kvworker CLI.
freekv_add_test(test_backend_cpu SOURCES test_backend_cpu.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_backend_cpu_kivi SOURCES test_backend_cpu_kivi.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_sampler SOURCES test_sampler.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_engine SOURCES test_engine.c LIBS freekv_runtime LABELS unit)
# The preset geometries at full width (1 layer, small vocab): a few hundred MB written and read.
add_test(NAME test_engine_presets COMMAND test_engine --presets)
set_tests_properties(test_engine_presets PROPERTIES LABELS slow SKIP_RETURN_CODE 77 TIMEOUT 600)
# Runs the real kvworker binary.
freekv_add_test(test_kvworker_cli SOURCES test_kvworker_cli.c LIBS freekv_runtime
  LABELS integration)
add_dependencies(test_kvworker_cli kvworker)
# The progress line of kvworker generate: on a terminal only (script(1) gives it one).
add_test(NAME test_progress
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_progress.sh ${PROJECT_BINARY_DIR}
          ${FREEKV_MODELS_DIR}/stories260K/stories260K.gguf
          ${CMAKE_CURRENT_SOURCE_DIR}/data/stories_corpus.txt)
set_tests_properties(test_progress PROPERTIES LABELS integration SKIP_RETURN_CODE 77)
