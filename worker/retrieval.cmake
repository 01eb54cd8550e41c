# Retrieval: selection semantics and (later) the streaming / quest / freekv policies.
target_sources(freekv_runtime PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/select.c
  ${CMAKE_CURRENT_SOURCE_DIR}/layout.c)
