# worker/engine.cmake — the backend interface with its CPU backend, the KV policy seam (`full`),
# the engine, sampling, and the kvworker executable.
target_sources(freekv_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/backend_cpu.c
  ${CMAKE_CURRENT_LIST_DIR}/policy_full.c
  ${CMAKE_CURRENT_LIST_DIR}/engine.c
  ${CMAKE_CURRENT_LIST_DIR}/sampler.c)
target_link_libraries(freekv_runtime PUBLIC PkgConfig::OPENBLAS OpenMP::OpenMP_C)

add_executable(kvworker
  ${CMAKE_CURRENT_LIST_DIR}/kvworker.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_common.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_generate.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_perplexity.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_eval.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_synth.c)
freekv_target(kvworker)
target_link_libraries(kvworker PRIVATE freekv_runtime)
install(TARGETS kvworker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
