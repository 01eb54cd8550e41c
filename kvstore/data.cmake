# kvstore/data.cmake — kvstored's data side: the shared-memory pool and its slab classes, the
# NVMe tier on io_uring, and the per-worker shared-memory rings. All of it goes into
# freekv_store_common because both the daemon and the client library (pool mapping, rings) use it.
target_sources(freekv_store_common PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/slab.c
  ${CMAKE_CURRENT_SOURCE_DIR}/pool.c
  ${CMAKE_CURRENT_SOURCE_DIR}/tier.c
  ${CMAKE_CURRENT_SOURCE_DIR}/ring.c)
# shm_open lives in librt on older glibc; liburing for the tier.
target_link_libraries(freekv_store_common PUBLIC PkgConfig::URING rt)
