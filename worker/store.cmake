# worker/store.cmake — hostkv, the worker's link to the host copy of its KV: over a running
# kvstored (the client library) or an embedded store built from kvstored's own sequence table
# and data plane (freekv_store_service), so freekv_runtime links both.
target_sources(freekv_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/hostkv.c
  ${CMAKE_CURRENT_LIST_DIR}/hostkv_remote.c
  ${CMAKE_CURRENT_LIST_DIR}/hostkv_embedded.c)
target_link_libraries(freekv_runtime PUBLIC freekv_store freekv_store_service PkgConfig::JSONC)

# The command that continues a sequence kvstored keeps.
target_sources(kvworker PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cmd_resume.c)
