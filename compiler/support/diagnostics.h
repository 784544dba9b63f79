// User diagnostics: errors and warnings located in .fuse sources, printed as
//   file:line:col: error: message
//     <source line>
//           ^
//   note/hint: ...
// Internal invariants use OPFUSE_ASSERT (support/assert.h) instead.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "support/source_manager.h"

namespace opfuse {

enum class Severity { Error, Warning, Note };

struct Diagnostic {
  Severity severity = Severity::Error;
  SourceLoc loc;
  std::string message;
  std::string hint;  // optional: what to change
};

class DiagnosticEngine {
 public:
  // After this many errors further errors are counted but not kept; one line says so.
  static constexpr size_t kDefaultErrorLimit = 20;

  explicit DiagnosticEngine(const SourceManager& sources) : sources_(sources) {}

  void error(SourceLoc loc, std::string message, std::string hint = {});
  void warning(SourceLoc loc, std::string message, std::string hint = {});
  void note(SourceLoc loc, std::string message);

  size_t error_count() const { return error_count_; }
  size_t warning_count() const { return warning_count_; }
  bool has_errors() const { return error_count_ > 0; }
  // True once the error limit is reached: callers may stop early.
  bool at_error_limit() const { return error_count_ >= error_limit_; }
  void set_error_limit(size_t limit) { error_limit_ = limit; }
  void set_warnings_as_errors(bool on) { warnings_as_errors_ = on; }

  const std::vector<Diagnostic>& diagnostics() const { return diags_; }
  // Renders one diagnostic with its source line and caret.
  std::string format(const Diagnostic& d) const;
  // Renders every kept diagnostic, plus a line for the ones dropped past the limit.
  std::string format_all() const;

 private:
  void add(Severity s, SourceLoc loc, std::string message, std::string hint);

  const SourceManager& sources_;
  std::vector<Diagnostic> diags_;
  size_t error_count_ = 0;
  size_t warning_count_ = 0;
  size_t error_limit_ = kDefaultErrorLimit;
  bool warnings_as_errors_ = false;
};

}  // namespace opfuse
