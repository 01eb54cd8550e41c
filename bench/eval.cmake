# bench/eval.cmake — decode_bench: per-step decode time of each KV policy and its breakdown
# (selection, recall exposed / hidden, attention, rest) at long contexts on the CPU backend, on
# a synthetic model with Llama-3.1-8B attention geometry. Run by hand:
#   build/bench/decode_bench [--quick] [--ctx 4096,8192,16384,32768] [-m MODEL_DIR]
add_executable(decode_bench ${CMAKE_CURRENT_LIST_DIR}/decode_bench.c)
freekv_target(decode_bench)
target_link_libraries(decode_bench PRIVATE freekv_runtime)
