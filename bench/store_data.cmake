# bench/store_data.cmake — benchmarks of kvstored's data side. bench_tier compares the NVMe tier
# with fio on the same file (fio must be installed when it runs); bench_pool compares pool block
# copies with plain memcpy between private buffers.
add_executable(bench_tier ${CMAKE_CURRENT_SOURCE_DIR}/bench_tier.c)
freekv_target(bench_tier)
target_compile_definitions(bench_tier PRIVATE FREEKV_BUILD_DIR="${PROJECT_BINARY_DIR}")
target_link_libraries(bench_tier PRIVATE freekv_store_service PkgConfig::JSONC)

add_executable(bench_pool ${CMAKE_CURRENT_SOURCE_DIR}/bench_pool.c)
freekv_target(bench_pool)
target_link_libraries(bench_pool PRIVATE freekv_store_service)

# bench_fsync: a small write + fdatasync appending, over synced zeros and into fallocated space,
# quiet and beside random O_DIRECT I/O, and with a thread writing zeros ahead (docs/design.md §4).
add_executable(bench_fsync ${CMAKE_CURRENT_SOURCE_DIR}/bench_fsync.c)
freekv_target(bench_fsync)
find_package(Threads REQUIRED)
target_link_libraries(bench_fsync PRIVATE Threads::Threads)
