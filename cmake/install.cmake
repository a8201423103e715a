# `cmake --install BUILD --prefix P`: the headers, libcoda.so.MAJOR, the fp64 reference (a static
# library for self-checking programs), a CMake package (find_package(coda): coda::coda,
# coda::reference) and a pkg-config file (coda.pc), all relocatable with the prefix.
include(CMakePackageConfigHelpers)

install(TARGETS coda coda_reference EXPORT codaTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/coda DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/reference/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/coda/reference FILES_MATCHING PATTERN "*.hpp")

set(CODA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/coda)
install(EXPORT codaTargets NAMESPACE coda:: DESTINATION ${CODA_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/codaConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/codaConfig.cmake
                              INSTALL_DESTINATION ${CODA_CMAKE_DIR})
# 0.x: a new minor version may change the ABI (the SONAME is libcoda.so.0 for all of them, so
# the package says which minor it is).
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/codaConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/codaConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/codaConfigVersion.cmake
        DESTINATION ${CODA_CMAKE_DIR})

# pkg-config: the prefix relative to the .pc file, so `--prefix` at install time holds.
string(REGEX REPLACE "[^/]+" ".." CODA_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
set(CODA_PC_CFLAGS "")
set(CODA_PC_LIBS_PRIVATE "")
if(CODA_ENABLE_CUDA)
  set(CODA_PC_CFLAGS "-DCODA_WITH_CUDA=1")
  set(CODA_PC_LIBS_PRIVATE "-lcudart -lcublasLt")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/coda.pc.in ${CMAKE_CURRENT_BINARY_DIR}/coda.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/coda.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/CHANGELOG.md
              ${PROJECT_SOURCE_DIR}/README.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
