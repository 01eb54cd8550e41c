freekv_add_test(test_select SOURCES test_select.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_layout SOURCES test_layout.c LIBS freekv_runtime LABELS unit)
