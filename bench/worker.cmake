# bench/worker.cmake — engine throughput on the CPU backend (prefill and decode tok/s at 1 and 2
# threads, stories260K and a synthetic Llama-3.1-8B-geometry model). Run by hand:
#   build/bench/bench_decode_cpu [-p 128] [-n 32]
add_executable(bench_decode_cpu ${CMAKE_CURRENT_LIST_DIR}/bench_decode_cpu.c)
freekv_target(bench_decode_cpu)
target_link_libraries(bench_decode_cpu PRIVATE freekv_runtime)
target_compile_definitions(bench_decode_cpu PRIVATE FREEKV_MODELS_DIR="${FREEKV_MODELS_DIR}")
