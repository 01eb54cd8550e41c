# bench/store_service.cmake — control-plane and ring round trips of a real kvstored against a raw
# ZeroMQ REQ/REP baseline on the same transport. Run: build/bench/bench_rpc [ROUNDS]
add_executable(bench_rpc ${CMAKE_CURRENT_LIST_DIR}/bench_rpc.c)
freekv_target(bench_rpc)
target_link_libraries(bench_rpc PRIVATE freekv_store)
target_compile_definitions(bench_rpc PRIVATE FREEKV_BUILD_DIR="${PROJECT_BINARY_DIR}")
add_dependencies(bench_rpc kvstored)
# What durable metadata costs: COMMIT latency with the journal against persist = false, and with
# the journal's records over zeros written ahead against appending (same run), and the restart
# time of a 1 GiB pool. Run: build/bench/bench_journal [ROUNDS [REPS [BLOCKS]]]
add_executable(bench_journal ${CMAKE_CURRENT_LIST_DIR}/bench_journal.c)
freekv_target(bench_journal)
target_link_libraries(bench_journal PRIVATE freekv_store)
target_compile_definitions(bench_journal PRIVATE FREEKV_BUILD_DIR="${PROJECT_BINARY_DIR}")
add_dependencies(bench_journal kvstored)
