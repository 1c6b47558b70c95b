# `cmake --install` puts the tools, the libraries, the headers (including the
# generated .inc files) and a CMake package (find_package(MoeMLIR)) under the
# prefix.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Installed tools and libraries find ours next to them and MLIR where it was.
set(MOE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR};${LLVM_LIBRARY_DIR}")
set_target_properties(moe-opt moe-compile moe-model moe-train moert-check moert-gpu-info moert-train MoeMLIR-C
  moert PROPERTIES INSTALL_RPATH "${MOE_INSTALL_RPATH}")

set(MOE_LIBRARIES)
foreach(lib MoESupport MoEDialect MoEUtils MoETransforms MoEConversion MoEGPUConversion
            MoERuntimeConversion MoEPipelines MoEModels MoECompiler)
  if(TARGET ${lib})
    list(APPEND MOE_LIBRARIES ${lib})
  endif()
endforeach()
foreach(lib ${MOE_LIBRARIES})
  target_include_directories(${lib} INTERFACE
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endforeach()
install(TARGETS ${MOE_LIBRARIES} MoeMLIR-C moert
  EXPORT MoeMLIRTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS moe-opt moe-compile moe-model moe-train moert-check moert-gpu-info moert-train
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET moert-ep-check)
  install(TARGETS moert-ep-check RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  set_target_properties(moert-ep-check PROPERTIES INSTALL_RPATH "${MOE_INSTALL_RPATH}")
endif()
install(DIRECTORY include/moe include/moe-c runtime/include/moert
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h" PATTERN "*.td")
install(DIRECTORY ${PROJECT_BINARY_DIR}/include/moe
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.inc")
install(EXPORT MoeMLIRTargets NAMESPACE MoeMLIR::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/MoeMLIR)
# (Generated outside the build directory's root, where find_package would
# take them for a usable package: the build tree has no targets file.)
set(MOE_PACKAGE_FILES ${PROJECT_BINARY_DIR}/install-package)
configure_package_config_file(cmake/MoeMLIRConfig.cmake.in
  ${MOE_PACKAGE_FILES}/MoeMLIRConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/MoeMLIR
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_BINDIR)
# find_package(MoeMLIR 0.1): before 1.0 a minor version may change the API,
# so only the same major.minor is compatible.
write_basic_package_version_file(${MOE_PACKAGE_FILES}/MoeMLIRConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${MOE_PACKAGE_FILES}/MoeMLIRConfig.cmake
  ${MOE_PACKAGE_FILES}/MoeMLIRConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/MoeMLIR)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/moe-mlir)
