# tests/systemd.cmake — the units in systemd/ pass `systemd-analyze verify` (skipped when the
# command is missing) and the default kvstored.conf parses.
freekv_add_test(test_systemd_units SOURCES test_systemd_units.c LABELS unit)
add_dependencies(test_systemd_units kvstored kvgate)
