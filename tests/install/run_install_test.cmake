# Installs the build tree into a fresh prefix, then configures, builds and runs a consumer that
# uses find_package(opfuse) — what an application embedding the runtime does.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
macro(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}")
  endif()
endmacro()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
foreach(f bin/fusec include/opfuse/version.h lib/cmake/opfuse/opfuseConfig.cmake)
  if(NOT EXISTS ${WORK_DIR}/prefix/${f})
    message(FATAL_ERROR "install is missing ${f}")
  endif()
endforeach()
# The installed headers are the embedding API (runtime/include/opfuse) and nothing else: no
# compiler, runtime-internal or reference header, so an application cannot come to depend on one.
file(GLOB_RECURSE installed_headers RELATIVE ${WORK_DIR}/prefix/include ${WORK_DIR}/prefix/include/*)
file(GLOB_RECURSE public_headers RELATIVE ${SOURCE_DIR}/runtime/include
     ${SOURCE_DIR}/runtime/include/*)
list(SORT installed_headers)
list(SORT public_headers)
if(NOT installed_headers STREQUAL public_headers)
  message(FATAL_ERROR "the install has headers that are not the public API (runtime/include):\n"
                      "  installed: ${installed_headers}\n  public: ${public_headers}")
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/consumer
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer)
message(STATUS "consumer said: ${out}")
run(${WORK_DIR}/prefix/bin/fusec check ${SOURCE_DIR}/dsl_examples/mlp.fuse)
# The example application (examples/embed) builds against the installed package the same way and
# runs: on the GPU where there is one, else it compiles the kernels and says why it stops.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/embed -B ${WORK_DIR}/embed
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/embed)
run(${CMAKE_COMMAND} -E env OPFUSE_CACHE_DIR=${WORK_DIR}/kernel-cache
    ${WORK_DIR}/embed/embed_mlp ${SOURCE_DIR}/dsl_examples/mlp.fuse 64 ${WORK_DIR}/embed.state)
message(STATUS "embed_mlp said: ${out}")
if(NOT out MATCHES "compiled .*mlp.fuse for sm_")
  message(FATAL_ERROR "embed_mlp did not report its build: ${out}")
endif()
