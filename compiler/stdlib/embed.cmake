# Writes the standard op library (std.fuse) into a C++ source as a string, so that `import "std"`
# works from an installed fusec and from the embedding API with no file to find at run time.
# Run as: cmake -DINPUT=std.fuse -DOUTPUT=std_fuse.cpp -P embed.cmake
file(READ "${INPUT}" OPFUSE_STD_TEXT)
string(FIND "${OPFUSE_STD_TEXT}" ")opfuse_std\"" OPFUSE_STD_BAD)
if(NOT OPFUSE_STD_BAD EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string delimiter )opfuse_std\"")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from compiler/stdlib/std.fuse by compiler/stdlib/embed.cmake; do not edit.\n"
  "#include \"dsl/stdlib.h\"\n\n"
  "namespace opfuse::dsl {\n\n"
  "std::string_view standard_library_source() {\n"
  "  static constexpr char kText[] = R\"opfuse_std(${OPFUSE_STD_TEXT})opfuse_std\";\n"
  "  return {kText, sizeof(kText) - 1};\n"
  "}\n\n"
  "}  // namespace opfuse::dsl\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
