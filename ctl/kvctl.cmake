# ctl/kvctl.cmake — kvctl, the operator CLI, on the client library (freekv_store) and json-c.
add_executable(kvctl ${CMAKE_CURRENT_LIST_DIR}/kvctl.c)
freekv_target(kvctl)
target_link_libraries(kvctl PRIVATE freekv_store PkgConfig::JSONC)
install(TARGETS kvctl DESTINATION ${CMAKE_INSTALL_BINDIR})
