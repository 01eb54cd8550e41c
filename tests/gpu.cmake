# tests/gpu.cmake — one test per kernel file (tests/gpu/test_kernel_<op>.c), each against a CPU
# twin (the CPU backend, worker/select.c, worker/layout.c). Label gpu; they exit 77 (skip) on a
# machine without a CUDA device, so CI only compiles them.
if(FREEKV_HAVE_CUDA)
  foreach(op embedding rope silu_mul kv_append page_summary page_score topk qcos
             recall_scatter offload_gather decode_attention prefill_attention gemm)
    freekv_add_test(test_kernel_${op} SOURCES gpu/test_kernel_${op}.c
      LIBS freekv_kernels freekv_runtime CUDA::cudart CUDA::cublas LABELS gpu)
  endforeach()
endif()
if(FREEKV_HAVE_CUDA)
  # test_kernel_rmsnorm is registered in tests/CMakeLists.txt; its weight-dtype case compares
  # with the CPU backend.
  target_link_libraries(test_kernel_rmsnorm PRIVATE freekv_runtime)
endif()
