# Fuzz targets (libFuzzer, clang from Debian), built in a sub-build with clang whatever compiles the
# rest, and run for 60 s each by ctest (label fuzz): the two topology XML loaders with the shared
# topology files as seeds; what a stranger on the network can send (the bootstrap's wire decoding,
# the socket transport's frames) with the seeds in fuzz/seeds. Included from tests/CMakeLists.txt.
option(BRAID_BUILD_FUZZERS "Build the fuzz targets when clang has libFuzzer" ON)
find_program(BRAID_CLANGXX NAMES clang++ clang++-14)
set(BRAID_FUZZ_OK FALSE)
if(BRAID_BUILD_FUZZERS AND BRAID_CLANGXX)
  set(probe ${CMAKE_BINARY_DIR}/CMakeFiles/braid_fuzz_probe.cc)
  file(WRITE ${probe} "#include <cstddef>\n#include <cstdint>\n"
    "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
  execute_process(
    COMMAND ${BRAID_CLANGXX} -fsanitize=fuzzer,address,undefined ${probe}
            -o ${CMAKE_BINARY_DIR}/CMakeFiles/braid_fuzz_probe
    RESULT_VARIABLE probe_result OUTPUT_QUIET ERROR_QUIET)
  if(probe_result EQUAL 0)
    set(BRAID_FUZZ_OK TRUE)
  endif()
endif()
if(NOT BRAID_FUZZ_OK)
  message(STATUS "braid: no clang with -fsanitize=fuzzer (install clang and libclang-rt-14-dev): "
                 "fuzz targets not built")
  return()
endif()
message(STATUS "braid: fuzz targets built with ${BRAID_CLANGXX}")

include(ExternalProject)
set(BRAID_FUZZ_BINARY_DIR ${CMAKE_BINARY_DIR}/topology_fuzz)
ExternalProject_Add(braid_topology_fuzzers
  SOURCE_DIR ${CMAKE_CURRENT_LIST_DIR}/fuzz
  BINARY_DIR ${BRAID_FUZZ_BINARY_DIR}
  CMAKE_ARGS -DCMAKE_CXX_COMPILER=${BRAID_CLANGXX} -DBRAID_ROOT=${PROJECT_SOURCE_DIR}
             -DCMAKE_BUILD_TYPE=RelWithDebInfo
  INSTALL_COMMAND ""
  BUILD_ALWAYS ON)

set(BRAID_SHARED_TOPOLOGIES ${PROJECT_SOURCE_DIR}/../shared/topologies)
foreach(loader nccl_xml hwloc_xml)
  add_test(NAME fuzz_topology_${loader}
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/fuzz/run_fuzzer.sh ${BRAID_FUZZ_BINARY_DIR}/fuzz_${loader}
            ${BRAID_SHARED_TOPOLOGIES}/xml ${BRAID_FUZZ_BINARY_DIR}/corpus_${loader} 60
            ${CMAKE_CURRENT_LIST_DIR}/fuzz/xml.dict)
  set_tests_properties(fuzz_topology_${loader} PROPERTIES LABELS fuzz TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
foreach(wire bootstrap_wire socket_frames)
  add_test(NAME fuzz_${wire}
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/fuzz/run_fuzzer.sh ${BRAID_FUZZ_BINARY_DIR}/fuzz_${wire}
            ${CMAKE_CURRENT_LIST_DIR}/fuzz/seeds/${wire} ${BRAID_FUZZ_BINARY_DIR}/corpus_${wire} 60)
  set_tests_properties(fuzz_${wire} PROPERTIES LABELS fuzz TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
