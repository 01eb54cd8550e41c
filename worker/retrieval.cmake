# Retrieval: selection semantics, layouts, and the streaming / quest / freekv policies.
target_sources(freekv_runtime PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/select.c
  ${CMAKE_CURRENT_SOURCE_DIR}/layout.c)
# Retrieval policies: write-through, paged device state, recall stream, the flags.
target_sources(freekv_runtime PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/kv_writethrough.c
  ${CMAKE_CURRENT_SOURCE_DIR}/recall.c
  ${CMAKE_CURRENT_SOURCE_DIR}/policy_paged.c
  ${CMAKE_CURRENT_SOURCE_DIR}/policy_streaming.c
  ${CMAKE_CURRENT_SOURCE_DIR}/policy_quest.c
  ${CMAKE_CURRENT_SOURCE_DIR}/policy_freekv.c
  ${CMAKE_CURRENT_SOURCE_DIR}/policy_opts.c)
