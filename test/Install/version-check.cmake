# cmake -DFILE=<MoeMLIRConfigVersion.cmake> "-DWANTS=0.1;0.2" -P version-check.cmake
# prints "<version>: TRUE|FALSE" for each, whether find_package(MoeMLIR
# <version>) accepts the installed package.
set(CMAKE_SIZEOF_VOID_P 8)
foreach(want ${WANTS})
  set(PACKAGE_FIND_VERSION ${want})
  string(REPLACE "." ";" parts "${want}.0.0")
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
  list(GET parts 2 PACKAGE_FIND_VERSION_PATCH)
  unset(PACKAGE_VERSION_COMPATIBLE)
  include(${FILE})
  if(PACKAGE_VERSION_COMPATIBLE)
    message("${want}: TRUE")
  else()
    message("${want}: FALSE")
  endif()
endforeach()
