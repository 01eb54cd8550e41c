# tests/store_link.cmake — the worker's link to kvstored: hostkv against the embedded store and a
# real kvstored; kvworker killed mid-generation and resumed; two workers on one kvstored; prefix
# sharing and forks between workers; sequences moved between two kvstored through Redis.
# Integration tests: they start real kvstored (and kvworker) processes on temporary names.
freekv_add_test(test_hostkv SOURCES test_hostkv.c LIBS freekv_runtime LABELS integration
  TIMEOUT 120)
add_dependencies(test_hostkv kvstored)
foreach(t resume two_workers restart_workers prefix prefix_logits remote)
  if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/test_${t}.c)
    freekv_add_test(test_${t} SOURCES test_${t}.c LIBS freekv_runtime LABELS integration
      TIMEOUT 180)
    add_dependencies(test_${t} kvstored kvworker)
  endif()
endforeach()
# One sequence's KV larger than kvstored's DRAM pool: kvworker with --lease-budget against a
# 2 MiB pool and an NVMe tier (generate with three policies; resume, and no budget: ENOSPC).
foreach(t lease_budget lease_resume)
  freekv_add_test(test_${t} SOURCES test_${t}.c LIBS freekv_runtime LABELS integration
    TIMEOUT 180)
  add_dependencies(test_${t} kvstored kvworker)
endforeach()
# kvstored killed at 20 random moments while two workers decode: every run stays exact.
if(TARGET test_restart_workers)
  add_test(NAME test_restart_workers_slow COMMAND test_restart_workers --slow)
  set_tests_properties(test_restart_workers_slow PROPERTIES LABELS slow SKIP_RETURN_CODE 77
    TIMEOUT 900)
endif()
