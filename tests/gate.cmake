# tests/gate.cmake — kvgate with real processes (kvstored, two kvworker serve, kvgate) and real
# clients (the openai package from the project virtualenv, http.client, curl). Skips (77) with
# the reason when the virtualenv is missing (scripts/venv.sh makes it).
add_test(NAME test_gate
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gate/run.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
    ${FREEKV_MODELS_DIR}/stories260K/stories260K.gguf test_gate.py)
set_tests_properties(test_gate PROPERTIES LABELS integration SKIP_RETURN_CODE 77 TIMEOUT 300)
# The units' SystemCallFilter= against every system call the three daemons make (strace).
add_test(NAME test_unit_syscalls
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/gate/test_unit_syscalls.py --build ${PROJECT_BINARY_DIR}
    --model ${FREEKV_MODELS_DIR}/stories260K/stories260K.gguf)
set_tests_properties(test_unit_syscalls PROPERTIES LABELS integration SKIP_RETURN_CODE 77 TIMEOUT 300)
# The gateway's pure modules, one test each.
freekv_add_test(test_chat_template SOURCES test_chat_template.c LIBS freekv_gate LABELS unit)
freekv_add_test(test_textout SOURCES test_textout.c LIBS freekv_gate LABELS unit)
freekv_add_test(test_openai SOURCES test_openai.c LIBS freekv_gate LABELS unit)
# test_gate runs these binaries; ctest does not build them.
add_custom_target(test_gate_deps ALL DEPENDS kvgate kvworker kvstored)
# metrics/prom.c, the text format the three processes share.
freekv_add_test(test_prom SOURCES test_prom.c LIBS freekv_metrics LABELS unit)
