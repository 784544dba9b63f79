# Seeds a corpus from the examples and must-fail inputs, then runs the fuzzer for a bounded time.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
file(GLOB seeds ${SOURCE_DIR}/dsl_examples/*.fuse ${SOURCE_DIR}/tests/errors/*.fuse)
file(COPY ${seeds} DESTINATION ${WORK_DIR})
execute_process(
  COMMAND ${FUZZER} -max_total_time=60 -timeout=5 -rss_limit_mb=2048 -max_len=8192 -artifact_prefix=${WORK_DIR}/
          -dict=${SOURCE_DIR}/tests/fuzz/fuse.dict ${WORK_DIR}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fuzz_frontend failed (exit ${rc}); the crashing input is in the working directory")
endif()
