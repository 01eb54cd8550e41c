# bench/gpu.cmake — GPU kernel micro-benchmarks (bench/gpu/bench_kernels.c); bench/gpu/run.sh
# builds and runs them with the GPU tests on a CUDA machine.
if(FREEKV_HAVE_CUDA)
  add_executable(bench_kernels ${CMAKE_CURRENT_LIST_DIR}/gpu/bench_kernels.c)
  freekv_target(bench_kernels)
  target_link_libraries(bench_kernels PRIVATE freekv_kernels CUDA::cudart)
endif()
if(FREEKV_HAVE_CUDA)
  # Decode step latency on the CUDA backend, Llama-3.1-8B geometry (bench/gpu/run.sh runs it).
  add_executable(bench_decode_gpu ${CMAKE_CURRENT_LIST_DIR}/gpu/bench_decode_gpu.c)
  freekv_target(bench_decode_gpu)
  target_link_libraries(bench_decode_gpu PRIVATE freekv_runtime CUDA::cudart)
endif()
