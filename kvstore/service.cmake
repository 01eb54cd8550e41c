# kvstore/service.cmake — kvstored's service side and the client library.
#   freekv_store_service — the daemon's modules (config table, sequences, worker registry,
#                          control plane, data plane, sd_notify), linked by kvstored and tests
#   freekv_store         — the client library (freekv_store.h) used by kvworker and kvctl
#   kvstored             — the daemon (kvstored.c is main only)
add_library(freekv_store_service STATIC
  ${CMAKE_CURRENT_LIST_DIR}/config.c
  ${CMAKE_CURRENT_LIST_DIR}/seq.c
  ${CMAKE_CURRENT_LIST_DIR}/workers.c
  ${CMAKE_CURRENT_LIST_DIR}/dataplane.c
  ${CMAKE_CURRENT_LIST_DIR}/dataplane_swap.c
  ${CMAKE_CURRENT_LIST_DIR}/dataplane_thread.c
  ${CMAKE_CURRENT_LIST_DIR}/rpc.c
  ${CMAKE_CURRENT_LIST_DIR}/sdnotify.c)
freekv_target(freekv_store_service)
target_include_directories(freekv_store_service PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(freekv_store_service PUBLIC freekv_store_common freekv_proto PkgConfig::ZMQ)

add_library(freekv_store STATIC ${CMAKE_CURRENT_LIST_DIR}/client.c)
freekv_target(freekv_store)
target_include_directories(freekv_store PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(freekv_store PUBLIC freekv_store_common freekv_proto PkgConfig::ZMQ)

# kvstored links the client library only to ask whether another daemon already serves its
# endpoint before it takes the pool name.
add_executable(kvstored ${CMAKE_CURRENT_LIST_DIR}/kvstored.c)
freekv_target(kvstored)
target_link_libraries(kvstored PRIVATE freekv_store_service freekv_store)

install(TARGETS kvstored DESTINATION ${CMAKE_INSTALL_SBINDIR})
install(TARGETS freekv_store ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The public header includes ring.h (entry layouts) and the generated protocol header.
install(FILES ${CMAKE_CURRENT_LIST_DIR}/freekv_store.h ${CMAKE_CURRENT_LIST_DIR}/ring.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/freekv)
install(FILES ${PROJECT_BINARY_DIR}/proto/gen/proto/kvstore.pb-c.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/freekv/proto)
