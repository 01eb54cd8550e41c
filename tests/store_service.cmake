# tests/store_service.cmake — kvstored's service side: unit tests of the config table, the
# control-plane codec and the sequence table; integration tests that start real kvstored
# processes (temporary shm name, ipc endpoint and NVMe file under /tmp).
freekv_add_test(test_config SOURCES test_config.c LIBS freekv_store_service LABELS unit)
freekv_add_test(test_seq SOURCES test_seq.c LIBS freekv_store_service LABELS unit)
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/test_rpc.c)
  freekv_add_test(test_rpc SOURCES test_rpc.c LIBS freekv_store_service LABELS unit)
endif()

foreach(t data liveness badinput lifecycle kvctl identity swap access restart)
  if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/test_kvstored_${t}.c)
    freekv_add_test(test_kvstored_${t} SOURCES test_kvstored_${t}.c
      LIBS freekv_store PkgConfig::JSONC LABELS integration TIMEOUT 120)
    add_dependencies(test_kvstored_${t} kvstored kvctl)
  endif()
endforeach()
