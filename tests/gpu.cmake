# tests/gpu.cmake — one test per kernel file (tests/gpu/test_kernel_<op>.c), each against a CPU
# twin (the CPU backend, worker/backend/select.c, common/layout.c; test_kernel_kivi also covers
# attn_probs.cu and the CUDA backend's attn_kivi). Label gpu; they exit 77 (skip) on a
# machine without a CUDA device, so CI only compiles them.
if(FREEKV_HAVE_CUDA)
  # attn_scores covers attn_accum and gather_heads too (refreshkv's full step).
  foreach(op embedding rope silu_mul kv_append page_summary page_score topk qcos
             recall_scatter offload_gather decode_attention flash_decode prefill_attention gemm
             attn_scores pool_topk kivi)
    freekv_add_test(test_kernel_${op} SOURCES gpu/test_kernel_${op}.c
      LIBS freekv_kernels freekv_runtime CUDA::cudart CUDA::cublas LABELS gpu)
  endforeach()
endif()
if(FREEKV_HAVE_CUDA)
  # The CUDA backend's ops table against the CPU backend, and the engine end to end on both.
  freekv_add_test(test_backend_cuda SOURCES gpu/test_backend_cuda.c
    LIBS freekv_runtime CUDA::cudart LABELS gpu)
  # attn_decode_slots (split-K over slot lists) and recall_units on the recall streams (ordering
  # with compute, pageable and page-locked units, a second thread) vs the CPU backend.
  freekv_add_test(test_backend_cuda_slots SOURCES gpu/test_backend_cuda_slots.c
    LIBS freekv_runtime CUDA::cudart LABELS gpu)
  # recall_direct (DMA from where each unit lies, pageable and registered) vs the CPU backend.
  freekv_add_test(test_backend_cuda_recall SOURCES gpu/test_backend_cuda_recall.c
    LIBS freekv_runtime CUDA::cudart LABELS gpu)
  # 16-bit slots: recall_units and attn_decode_slots in f16/bf16 vs the CPU backend.
  freekv_add_test(test_backend_cuda_slots16 SOURCES gpu/test_backend_cuda_slots16.c
    LIBS freekv_runtime CUDA::cudart LABELS gpu)
  # page_summary, select_pages, group_cosine and download_async's fences vs the CPU backend.
  freekv_add_test(test_backend_cuda_select SOURCES gpu/test_backend_cuda_select.c
    LIBS freekv_runtime CUDA::cudart LABELS gpu)
  # streaming / quest / freekv on the CUDA backend (paged slots, recall_units) vs the CPU.
  freekv_add_test(test_policies_cuda SOURCES gpu/test_policies_cuda.c
    LIBS freekv_runtime CUDA::cudart LABELS gpu)
  # test_kernel_rmsnorm is registered in tests/CMakeLists.txt; its weight-dtype case compares
  # with the CPU backend.
  target_link_libraries(test_kernel_rmsnorm PRIVATE freekv_runtime)
endif()

# Backend choice (backend_open, kvworker --backend) on every build: without a device it checks
# the clear errors for --backend cuda, with one that cuda opens.
freekv_add_test(test_backend_select SOURCES gpu/test_backend_select.c LIBS freekv_runtime
  LABELS unit)
