# bench/load.cmake — kvload, a full host's load (workers, sequences, blocks, faults) on one
# kvstored, with every committed byte verified. See bench/load/README.md.
add_executable(kvload
  ${CMAKE_CURRENT_LIST_DIR}/load/kvload.c
  ${CMAKE_CURRENT_LIST_DIR}/load/load_worker.c
  ${CMAKE_CURRENT_LIST_DIR}/load/load_stats.c)
freekv_target(kvload)
target_link_libraries(kvload PRIVATE freekv_store)
target_compile_definitions(kvload PRIVATE FREEKV_BUILD_DIR="${PROJECT_BINARY_DIR}")
add_dependencies(kvload kvstored kvworker)

# CI: the quick preset without faults; the slow test adds faults for 60 s and real generations
# (tokens equal their runs alone) beside the load.
add_test(NAME test_kvload_quick COMMAND kvload --quick --duration 10)
set_tests_properties(test_kvload_quick PROPERTIES LABELS integration TIMEOUT 300)
add_test(NAME test_kvload_faults
  COMMAND kvload --quick --faults --duration 60 --generations 8
          --kvworker ${PROJECT_BINARY_DIR}/worker/kvworker
          --model ${FREEKV_MODELS_DIR}/stories260K/stories260K.gguf)
set_tests_properties(test_kvload_faults PROPERTIES LABELS slow TIMEOUT 600)

# The latency histogram against sorting (unit).
freekv_add_test(test_load_hist
  SOURCES ${PROJECT_SOURCE_DIR}/tests/test_load_hist.c ${CMAKE_CURRENT_LIST_DIR}/load/load_stats.c
  LIBS freekv_store LABELS unit)
target_include_directories(test_load_hist PRIVATE ${CMAKE_CURRENT_LIST_DIR}/load)
