# tests/real_model.cmake — SmolLM2-135M-Instruct through the real kvworker and kvstored against a
# float64 numpy reference (tests/slow/). Needs scripts/fetch-models.sh's model and venv; skips
# (77) without them. Label slow: run it with `ctest -L slow -R test_smollm2`.
add_test(NAME test_smollm2 COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slow/smollm2.sh ${PROJECT_BINARY_DIR})
set_tests_properties(test_smollm2 PROPERTIES LABELS slow SKIP_RETURN_CODE 77 TIMEOUT 1500)
