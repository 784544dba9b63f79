# Fails listing every file that clang-format would change. Fix with scripts/format.sh.
file(GLOB_RECURSE files
  ${SOURCE_DIR}/compiler/*.h ${SOURCE_DIR}/compiler/*.cpp
  ${SOURCE_DIR}/runtime/*.h ${SOURCE_DIR}/runtime/*.cpp
  ${SOURCE_DIR}/plan/*.h ${SOURCE_DIR}/plan/*.cpp
  ${SOURCE_DIR}/debug/*.h ${SOURCE_DIR}/debug/*.cpp
  ${SOURCE_DIR}/reference/*.h ${SOURCE_DIR}/reference/*.cpp
  ${SOURCE_DIR}/tools/*.h ${SOURCE_DIR}/tools/*.cpp
  ${SOURCE_DIR}/tests/*.h ${SOURCE_DIR}/tests/*.cpp
  ${SOURCE_DIR}/bench/*.cpp ${SOURCE_DIR}/examples/*.cpp
  ${SOURCE_DIR}/python/*.h ${SOURCE_DIR}/python/*.cpp)
set(bad "")
foreach(f ${files})
  execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${f} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND bad ${f})
  endif()
endforeach()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "not clang-format clean (run scripts/format.sh):\n  ${bad}")
endif()
