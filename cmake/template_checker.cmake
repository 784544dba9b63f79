# The template checker: tools/check_templates/check_templates.cpp (command line, comparison with
# the table) and template_scan.cpp (the Clang side), a Clang libTooling program that parses
# templates/ as CUDA device code and checks it against the kernel-template table
# (compiler/codegen/kernel_templates.h). Optional because the GPU machine has no libclang-16;
# CI installs clang-16, libclang-16-dev, libclang-common-16-dev and llvm-16-dev (scripts/setup.sh).
#
# OPFUSE_TEMPLATE_CHECKER: AUTO (build it when Clang 16 is found), ON (a missing Clang 16 is a
# configure error), OFF (skip).
#
# Note "CUDA 13 under Clang 16": Clang 16 knows CUDA up to 11.8 (a newer toolkit is only a
# warning, silenced with -Wno-unknown-cuda-version). Its CUDA wrapper header
# (__clang_cuda_runtime_wrapper.h, in the resource directory from libclang-common-16-dev)
# includes texture_fetch_functions.h, which CUDA 13 removed; the checker maps an empty file of
# that name into an in-memory include directory searched last (-idirafter). With that, every
# CUDA 13 header the templates use (cuda_fp8.h, cuda_bf16.h, cuda_fp16.h) parses, and their
# __host__/__device__ attributes are the real ones, which the host-call check relies on.
# -nocudainc would skip the wrapper and with it threadIdx, __syncthreads and the math
# declarations the templates call, so the checker keeps the wrapper and only drops libdevice
# (-nocudalib: it parses, it never generates code).

set(OPFUSE_TEMPLATE_CHECKER AUTO CACHE STRING
    "Build and run the Clang libTooling template checker: AUTO, ON or OFF")
set_property(CACHE OPFUSE_TEMPLATE_CHECKER PROPERTY STRINGS AUTO ON OFF)

# AUTO, or any CMake boolean (1, TRUE, NO, ...) read as ON or OFF.
string(TOUPPER "${OPFUSE_TEMPLATE_CHECKER}" OPFUSE_TEMPLATE_CHECKER_MODE)
if(NOT OPFUSE_TEMPLATE_CHECKER_MODE STREQUAL "AUTO")
  if(OPFUSE_TEMPLATE_CHECKER)
    set(OPFUSE_TEMPLATE_CHECKER_MODE ON)
  else()
    set(OPFUSE_TEMPLATE_CHECKER_MODE OFF)
  endif()
endif()

function(opfuse_template_checker_skipped reason)
  if(OPFUSE_TEMPLATE_CHECKER_MODE STREQUAL "ON")
    message(FATAL_ERROR "template checker: ${reason} (OPFUSE_TEMPLATE_CHECKER=ON)")
  endif()
  message(STATUS "template checker: skipped, ${reason}")
endfunction()

# A function, so the hundreds of LLVM_* variables (and LLVM's CMAKE_MODULE_PATH entry) that
# find_package(Clang) sets stay out of the project's scope; imported targets are unaffected.
function(opfuse_add_template_checker)
  if(OPFUSE_TEMPLATE_CHECKER_MODE STREQUAL "OFF")
    message(STATUS "template checker: skipped (OPFUSE_TEMPLATE_CHECKER=${OPFUSE_TEMPLATE_CHECKER})")
    return()
  endif()

  # LLVM's package probes its optional dependencies (zstd, CURL, ...) with STATUS messages that
  # read like problems of ours; hide them.
  set(CMAKE_MESSAGE_LOG_LEVEL NOTICE)
  # ClangConfig.cmake asks for LLVM's package as REQUIRED: where Clang's config exists without
  # LLVM's (the GPU machine) that would stop the configure, so probe LLVM first.
  find_package(LLVM 16 CONFIG QUIET HINTS /usr/lib/llvm-16/lib/cmake/llvm /usr/lib/cmake/llvm-16)
  if(NOT LLVM_FOUND)
    unset(CMAKE_MESSAGE_LOG_LEVEL)
    opfuse_template_checker_skipped("LLVM 16's CMake package not found (Debian: llvm-16-dev)")
    return()
  endif()
  find_package(Clang 16 CONFIG QUIET
    HINTS /usr/lib/llvm-16/lib/cmake/clang /usr/lib/cmake/clang-16)
  unset(CMAKE_MESSAGE_LOG_LEVEL)
  if(NOT Clang_FOUND)
    opfuse_template_checker_skipped(
      "Clang 16's CMake package not found (Debian: clang-16, libclang-16-dev, llvm-16-dev)")
    return()
  endif()
  set(OPFUSE_CLANG_RESOURCE_DIR "${LLVM_LIBRARY_DIR}/clang/${LLVM_VERSION_MAJOR}")
  if(NOT EXISTS "${OPFUSE_CLANG_RESOURCE_DIR}/include/__clang_cuda_runtime_wrapper.h")
    opfuse_template_checker_skipped(
      "no Clang CUDA headers in ${OPFUSE_CLANG_RESOURCE_DIR} (Debian: libclang-common-16-dev)")
    return()
  endif()
  # The shared libraries when the package has them (one fast link), else the static components.
  if(TARGET clang-cpp AND TARGET LLVM)
    set(OPFUSE_CLANG_LIBRARIES clang-cpp LLVM)
  else()
    set(OPFUSE_CLANG_LIBRARIES clangTooling clangFrontend clangDriver clangSerialization clangSema
        clangAST clangASTMatchers clangLex clangBasic LLVMSupport LLVMFrontendOpenMP
        LLVMOption)
  endif()
  message(STATUS "template checker: Clang ${LLVM_PACKAGE_VERSION} from ${Clang_DIR}")

  add_executable(check_templates tools/check_templates/check_templates.cpp
                                 tools/check_templates/template_scan.cpp)
  target_include_directories(check_templates SYSTEM PRIVATE ${CLANG_INCLUDE_DIRS}
                                                            ${LLVM_INCLUDE_DIRS})
  separate_arguments(OPFUSE_LLVM_DEFINITIONS NATIVE_COMMAND "${LLVM_DEFINITIONS}")
  target_compile_options(check_templates PRIVATE ${OPFUSE_LLVM_DEFINITIONS})
  # GCC 12's -Wnonnull misfires on Clang's inlined LazyOffsetPtr (RecursiveASTVisitor walking base
  # classes); the warning is about LLVM's header code, not ours.
  target_compile_options(check_templates PRIVATE -Wno-nonnull)
  # A class deriving from Clang's needs Clang's typeinfo; an LLVM built without RTTI has none.
  if(NOT LLVM_ENABLE_RTTI)
    target_compile_options(check_templates PRIVATE -fno-rtti)
  endif()
  target_compile_definitions(check_templates PRIVATE
    OPFUSE_SOURCE_TEMPLATES_DIR="${OPFUSE_SOURCE_TEMPLATES_DIR}"
    OPFUSE_CLANG_RESOURCE_DIR="${OPFUSE_CLANG_RESOURCE_DIR}")
  target_link_libraries(check_templates PRIVATE opfuse_compiler ${OPFUSE_CLANG_LIBRARIES}
                                                fmt::fmt opfuse_warnings)

  if(NOT OPFUSE_BUILD_TESTS)
    return()
  endif()

  # The toolkit root Clang parses against: the one the rest of the build found.
  get_filename_component(OPFUSE_CHECKER_CUDA_PATH "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  set(OPFUSE_CHECKER_COMMAND $<TARGET_FILE:check_templates> --cuda-path ${OPFUSE_CHECKER_CUDA_PATH})

  add_test(NAME template_checker
    COMMAND ${OPFUSE_CHECKER_COMMAND} --templates ${OPFUSE_SOURCE_TEMPLATES_DIR} --Werror
            # The debug statistics accumulate in double on purpose (docs/debugging.md,
            # "Statistics on the device"): sums over a whole tensor must hold 1e-5.
            --fp64-header tensor_stats.cuh --fp64-header quant_stats.cuh
            --fp64-header stat_record.cuh)
  set_tests_properties(template_checker PROPERTIES LABELS "cpu" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "checked [1-9][0-9]* entry templates, [1-9][0-9]* device functions")

  # Must-fail inputs: each directory of tests/template_checker/ is a small templates directory the
  # checker must reject with the messages in its case.txt (tests/template_checker/README.md).
  set(OPFUSE_CHECKER_CASES_DIR ${PROJECT_SOURCE_DIR}/tests/template_checker)
  file(GLOB OPFUSE_CHECKER_CASES LIST_DIRECTORIES true CONFIGURE_DEPENDS
       ${OPFUSE_CHECKER_CASES_DIR}/*)
  foreach(case_dir ${OPFUSE_CHECKER_CASES})
    if(NOT IS_DIRECTORY ${case_dir})
      continue()
    endif()
    get_filename_component(case ${case_dir} NAME)
    add_test(NAME template_checker_rejects_${case}
      COMMAND ${CMAKE_COMMAND} -DCASE_DIR=${case_dir}
              "-DCHECKER=$<TARGET_FILE:check_templates>;--cuda-path;${OPFUSE_CHECKER_CUDA_PATH}"
              -P ${OPFUSE_CHECKER_CASES_DIR}/expect_rejection.cmake)
    set_tests_properties(template_checker_rejects_${case} PROPERTIES LABELS "cpu" TIMEOUT 120)
  endforeach()
endfunction()

opfuse_add_template_checker()
