# tests/serve.cmake — `kvworker serve` and `kvworker client` with a real kvstored: concurrent
# clients against solo generate, bad requests, SIGTERM then resume. Integration: real processes.
freekv_add_test(test_serve SOURCES test_serve.c LIBS freekv_runtime LABELS integration
  TIMEOUT 180)
add_dependencies(test_serve kvstored kvworker kvctl)
# test_systemd_units runs kvworker@.service's ExecStart= command line with --print-config.
if(TARGET test_systemd_units)
  add_dependencies(test_systemd_units kvworker)
endif()
# The README's main job, `make demo` (scripts/demo.sh): two workers, a SIGKILL, resume, checked
# against an uninterrupted run; it must keep working as the tools it drives change.
add_test(NAME test_demo COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/demo.sh ${PROJECT_BINARY_DIR})
set_tests_properties(test_demo PROPERTIES LABELS integration TIMEOUT 600)
