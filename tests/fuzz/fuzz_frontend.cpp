// libFuzzer entry: any byte string through the whole front end must end in a program or in
// diagnostics, never in a crash, hang, sanitizer report or internal error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "driver/frontend.h"
#include "support/assert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  opfuse::SourceManager sources;
  opfuse::DiagnosticEngine diags(sources);
  std::string text(reinterpret_cast<const char*>(data), size);
  // Imports would read the file system; the fuzzer exercises them through missing files only.
  auto program = opfuse::load_program_from_source("fuzz.fuse", std::move(text), sources, diags);
  (void)diags.format_all();
  if (program && diags.has_errors()) __builtin_trap();  // a program is returned only without errors
  return 0;
}
