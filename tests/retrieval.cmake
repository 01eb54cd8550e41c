freekv_add_test(test_select SOURCES test_select.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_layout SOURCES test_layout.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_policy_opts SOURCES test_policy_opts.c LIBS freekv_runtime LABELS unit)
freekv_add_test(test_recall SOURCES test_recall.c LIBS freekv_runtime LABELS unit)
# Greedy generations of stories260K under every policy over an embedded host copy.
freekv_add_test(test_policies SOURCES test_policies.c LIBS freekv_runtime LABELS unit)
# The backend's selection ops (CPU twins against select.c) and the policies' use of them.
freekv_add_test(test_policy_ops SOURCES test_policy_ops.c LIBS freekv_runtime LABELS unit)
# hardkv and top-p selection against a float64 reference, on stories260K.
freekv_add_test(test_hardkv SOURCES test_hardkv.c LIBS freekv_runtime LABELS unit)
# refreshkv against `full` and an independent float64 reference of its semantics.
freekv_add_test(test_refreshkv SOURCES test_refreshkv.c refresh_ref.c LIBS freekv_runtime
  LABELS unit)
# specache against its float64 reference (test_specache_ref.h), its limiting cases, resume.
freekv_add_test(test_specache SOURCES test_specache.c LIBS freekv_runtime LABELS unit)
