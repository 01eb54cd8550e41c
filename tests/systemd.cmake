# tests/systemd.cmake — the units in systemd/ pass `systemd-analyze verify` (skipped when the
# command is missing) and the default kvstored.conf parses.
freekv_add_test(test_systemd_units SOURCES test_systemd_units.c LABELS unit)
add_dependencies(test_systemd_units kvstored kvgate)
target_compile_definitions(test_systemd_units PRIVATE
  FREEKV_INSTALL_SBINDIR="${CMAKE_INSTALL_FULL_SBINDIR}"
  FREEKV_INSTALL_BINDIR="${CMAKE_INSTALL_FULL_BINDIR}"
  FREEKV_INSTALL_CONFDIR="${CMAKE_INSTALL_FULL_SYSCONFDIR}/freekv")
# `cmake --install` into a DESTDIR: every path the installed units name exists in the tree, and
# the installed units (binaries pointed into the DESTDIR) pass `systemd-analyze verify`.
add_test(NAME test_install
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_install.sh ${PROJECT_BINARY_DIR}
          ${CMAKE_INSTALL_PREFIX})
set_tests_properties(test_install PROPERTIES LABELS integration TIMEOUT 300)
# The same on the .deb `cpack -G DEB` builds (cmake/package.cmake), extracted with dpkg-deb.
add_test(NAME test_deb
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_install.sh ${PROJECT_BINARY_DIR}
          ${CMAKE_INSTALL_PREFIX} deb)
set_tests_properties(test_deb PROPERTIES LABELS integration TIMEOUT 600)
# docs/man/: the pages render without a groff warning and document every option --help lists.
add_test(NAME test_man
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_man.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
set_tests_properties(test_man PROPERTIES LABELS unit SKIP_RETURN_CODE 77)
# scripts/completion/: bash completion of kvctl and kvworker.
add_test(NAME test_completion
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_completion.sh ${PROJECT_BINARY_DIR}
          ${PROJECT_SOURCE_DIR})
set_tests_properties(test_completion PROPERTIES LABELS unit SKIP_RETURN_CODE 77)
