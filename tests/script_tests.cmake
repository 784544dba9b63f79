# Tests driven by scripts rather than gtest.

add_test(NAME install_package
  COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
          -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/install_test
          -P ${CMAKE_CURRENT_SOURCE_DIR}/install/run_install_test.cmake)
set_tests_properties(install_package PROPERTIES LABELS "cpu;install" TIMEOUT 600)

# Every C++ source is clang-format clean (.clang-format at the root).
find_program(CLANG_FORMAT NAMES clang-format clang-format-14 clang-format-16)
if(CLANG_FORMAT)
  add_test(NAME format_check
    COMMAND ${CMAKE_COMMAND} -DCLANG_FORMAT=${CLANG_FORMAT} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/format_check.cmake)
  set_tests_properties(format_check PROPERTIES LABELS "cpu;style")
endif()

# clang-tidy with the checks in .clang-tidy, over compiler/, runtime/, reference/ and tools/
# (needs compile_commands.json).
find_program(CLANG_TIDY NAMES clang-tidy clang-tidy-14 clang-tidy-16)
if(CLANG_TIDY AND CMAKE_EXPORT_COMPILE_COMMANDS)
  add_test(NAME clang_tidy
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/clang_tidy.sh ${CLANG_TIDY} ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
  set_tests_properties(clang_tidy PROPERTIES LABELS "cpu;style" TIMEOUT 1800)
endif()

# Nothing may need the driver library to start (docs/design.md, "GPU-less machines": machines without a GPU have none).
add_test(NAME no_libcuda_dependency
  COMMAND sh -c "! readelf -d $<TARGET_FILE:fusec> | grep -E 'NEEDED.*libcuda\\.so'")
set_tests_properties(no_libcuda_dependency PROPERTIES LABELS "cpu")

# bench/compare.py on a recorded device run (tests/bench/compare_fixture): ratios, goals and the
# interleaved GEMM table, so the side-by-side report can be checked without a GPU.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME bench_compare_py
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/bench/test_compare.py)
  set_tests_properties(bench_compare_py PROPERTIES LABELS "cpu;bench")
  # bench/peers/summarize_tp.py (bench/run_tp.sh's table) on made-up reports in the real layout.
  add_test(NAME bench_summarize_tp_py
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/bench/test_summarize_tp.py)
  set_tests_properties(bench_summarize_tp_py PROPERTIES LABELS "cpu;bench")

  # The Python package (pyproject.toml, python/, docs/python.md): installed into a virtual
  # environment against this tree's libraries (the bindings alone compile), then its CPU tests and
  # stubs, and on a GPU with torch its torch tests (tests/python/run_package_tests.sh).
  set(OPFUSE_PYTHON_TEST_DIR ${CMAKE_CURRENT_BINARY_DIR}/python_package)
  set(OPFUSE_PYTHON_TEST_ENV PYTHON=${Python3_EXECUTABLE} SOURCE_DIR=${PROJECT_SOURCE_DIR}
      BUILD_DIR=${PROJECT_BINARY_DIR} FUSEC=$<TARGET_FILE:fusec>)
  foreach(mode install cpu gpu)
    add_test(NAME python_package_${mode}
      COMMAND ${CMAKE_COMMAND} -E env ${OPFUSE_PYTHON_TEST_ENV}
              ${CMAKE_CURRENT_SOURCE_DIR}/python/run_package_tests.sh ${mode} ${OPFUSE_PYTHON_TEST_DIR})
  endforeach()
  set_tests_properties(python_package_install PROPERTIES LABELS "cpu;python" TIMEOUT 1200
                       FIXTURES_SETUP python_package)
  set_tests_properties(python_package_cpu PROPERTIES LABELS "cpu;python" TIMEOUT 900
                       FIXTURES_REQUIRED python_package SKIP_RETURN_CODE 77)
  set_tests_properties(python_package_gpu PROPERTIES LABELS "gpu;python" TIMEOUT 900
                       FIXTURES_REQUIRED python_package
                       SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endif()

# bench/kernels/run.sh builds the kernel bench (bench/kernels/transpose_kernels.cu) against
# templates/ and the last commit's templates, so the bench cannot fall behind the templates it
# times (it had: the activations' functor contract changed under it). Build only: timing needs a
# GPU.
find_program(OPFUSE_NVCC nvcc HINTS ${CUDAToolkit_BIN_DIR} /usr/local/cuda/bin)
find_program(OPFUSE_GIT git)
if(OPFUSE_NVCC AND OPFUSE_GIT AND EXISTS ${PROJECT_SOURCE_DIR}/.git)
  add_test(NAME kernel_bench_builds
    COMMAND ${CMAKE_COMMAND} -E env BUILD_ONLY=1 BUILD=${CMAKE_CURRENT_BINARY_DIR}/kbench
            NVCC=${OPFUSE_NVCC} ${PROJECT_SOURCE_DIR}/bench/kernels/run.sh)
  set_tests_properties(kernel_bench_builds PROPERTIES LABELS "cpu;bench" TIMEOUT 900)
endif()
