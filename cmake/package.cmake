# cmake/package.cmake — `cpack -G DEB` in the build directory makes freekv_VERSION_ARCH.deb:
# the binaries, the client library and header, the units, the default configuration (conffiles
# under /etc), sysusers.d and tmpfiles.d entries and the docs, installed under this build's
# CMAKE_INSTALL_PREFIX (configure with -DCMAKE_INSTALL_PREFIX=/usr for a Debian layout: the
# units name the prefix's paths, so the package installs where they point). Its postinst creates
# the freekv user and /var/lib/freekv and reloads systemd; nothing is enabled or started.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME freekv)
set(CPACK_PACKAGE_VENDOR "freekv")
set(CPACK_PACKAGE_CONTACT "freekv maintainers <maintainers@freekv.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "KV-cache memory service and retrieval runtime for long-context LLM inference")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_SET_DESTDIR ON) # the configuration goes to an absolute /etc/freekv (or PREFIX/etc)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON) # Depends: from the binaries' libraries (dpkg-shlibdeps)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/deb/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
