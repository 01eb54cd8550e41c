# worker/engine.cmake — the backend interface with its CPU backend, the KV policy seam (`full`),
# the engine, sampling, and the kvworker executable. With CUDA, the CUDA backend's ops are the
# kernels of kernels/ (freekv_kernels) and FREEKV_HAVE_CUDA tells the C code so; without it,
# backend_cuda.c builds only a constructor that reports no device (backend_cuda_xfer.c, its
# transfers, is built only with CUDA).
target_sources(freekv_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/backend_cpu.c
  ${CMAKE_CURRENT_LIST_DIR}/backend_cuda.c
  ${CMAKE_CURRENT_LIST_DIR}/policy_full.c
  ${CMAKE_CURRENT_LIST_DIR}/engine.c
  ${CMAKE_CURRENT_LIST_DIR}/sampler.c)
target_link_libraries(freekv_runtime PUBLIC PkgConfig::OPENBLAS OpenMP::OpenMP_C)
if(FREEKV_HAVE_CUDA)
  target_sources(freekv_runtime PRIVATE ${CMAKE_CURRENT_LIST_DIR}/backend_cuda_xfer.c)
  target_link_libraries(freekv_runtime PUBLIC freekv_kernels)
  target_compile_definitions(freekv_runtime PUBLIC FREEKV_HAVE_CUDA=1)
endif()

add_executable(kvworker
  ${CMAKE_CURRENT_LIST_DIR}/kvworker.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_common.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_generate.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_perplexity.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_eval.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_synth.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_serve.c
  ${CMAKE_CURRENT_LIST_DIR}/serve_batch.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_client.c
  ${CMAKE_CURRENT_LIST_DIR}/cmd_info.c)
freekv_target(kvworker)
target_link_libraries(kvworker PRIVATE freekv_runtime)
install(TARGETS kvworker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
