# xgrammar (https://github.com/mlc-ai/xgrammar): the grammar engine behind structured outputs.
#
# Its C++ core is compiled from the release's PyPI source archive, pinned by SHA-256, into a
# static library of our own with our flags. We do not use its CMake project: that adds -Werror
# and -flto and builds Python bindings we never load. Only the core sources are compiled (not
# the tvm_ffi bindings under cpp/tvm_ffi).
#
# Offline builds (the GPU machine): put the archive in .whl/ beside the carried wheels, or
# point NINFER_XGRAMMAR_ARCHIVE at it, or FETCHCONTENT_SOURCE_DIR_XGRAMMAR at an unpacked copy
# of the same release. The hash is checked whichever way the archive comes.
include(FetchContent)

set(NINFER_XGRAMMAR_VERSION 0.2.9)
set(NINFER_XGRAMMAR_SHA256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
set(_xgrammar_local "${CMAKE_SOURCE_DIR}/.whl/xgrammar-${NINFER_XGRAMMAR_VERSION}.tar.gz")
if(EXISTS "${_xgrammar_local}")
  set(_xgrammar_default "${_xgrammar_local}")
else()
  set(_xgrammar_default
      "https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${NINFER_XGRAMMAR_VERSION}.tar.gz")
endif()
set(NINFER_XGRAMMAR_ARCHIVE "${_xgrammar_default}"
    CACHE STRING "URL or local path of the xgrammar source archive (sdist)")

# SOURCE_SUBDIR names a folder without a CMakeLists.txt, so MakeAvailable only downloads and
# unpacks: their project is never configured.
FetchContent_Declare(xgrammar
  URL "${NINFER_XGRAMMAR_ARCHIVE}"
  URL_HASH SHA256=${NINFER_XGRAMMAR_SHA256}
  DOWNLOAD_EXTRACT_TIMESTAMP TRUE
  SOURCE_SUBDIR ninfer-no-cmake-project)
FetchContent_MakeAvailable(xgrammar)
set(XGRAMMAR_ROOT ${xgrammar_SOURCE_DIR})

file(GLOB XGRAMMAR_CORE_SOURCES
  ${XGRAMMAR_ROOT}/cpp/*.cc
  ${XGRAMMAR_ROOT}/cpp/support/*.cc
  ${XGRAMMAR_ROOT}/cpp/converter_ext/*.cc)
if(NOT XGRAMMAR_CORE_SOURCES)
  message(FATAL_ERROR "no xgrammar sources under ${XGRAMMAR_ROOT}/cpp")
endif()

add_library(ninfer_xgrammar STATIC ${XGRAMMAR_CORE_SOURCES})
# Their sources are written for C++17 (their headers also compile as our C++20).
set_target_properties(ninfer_xgrammar PROPERTIES CXX_STANDARD 17)
target_include_directories(ninfer_xgrammar SYSTEM PUBLIC ${XGRAMMAR_ROOT}/include
  ${XGRAMMAR_ROOT}/3rdparty/dlpack/include ${XGRAMMAR_ROOT}/3rdparty/picojson)
target_compile_definitions(ninfer_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0)
# Third-party code: warnings are theirs to fix, so they are off here rather than noise in ours.
target_compile_options(ninfer_xgrammar PRIVATE -O2 -w)
target_link_libraries(ninfer_xgrammar PUBLIC Threads::Threads)
