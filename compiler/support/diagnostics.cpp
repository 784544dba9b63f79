#include "support/diagnostics.h"

#include <fmt/format.h>

#include <algorithm>

namespace opfuse {

void DiagnosticEngine::error(SourceLoc loc, std::string message, std::string hint) {
  add(Severity::Error, loc, std::move(message), std::move(hint));
}

void DiagnosticEngine::warning(SourceLoc loc, std::string message, std::string hint) {
  add(warnings_as_errors_ ? Severity::Error : Severity::Warning, loc, std::move(message),
      std::move(hint));
}

void DiagnosticEngine::note(SourceLoc loc, std::string message) {
  // A note belongs to the diagnostic before it; drop it if that one was dropped.
  if (error_count_ > error_limit_) return;
  diags_.push_back({Severity::Note, loc, std::move(message), {}});
}

void DiagnosticEngine::add(Severity s, SourceLoc loc, std::string message, std::string hint) {
  if (s == Severity::Error) {
    ++error_count_;
    if (error_count_ > error_limit_) return;
  } else {
    ++warning_count_;
  }
  diags_.push_back({s, loc, std::move(message), std::move(hint)});
}

namespace {

const char* severity_name(Severity s) {
  switch (s) {
    case Severity::Error:
      return "error";
    case Severity::Warning:
      return "warning";
    case Severity::Note:
      return "note";
  }
  return "error";
}

// Replaces control bytes so a binary file cannot garble the terminal; keeps columns aligned.
std::string printable(std::string_view line) {
  std::string out;
  out.reserve(line.size());
  for (unsigned char c : line) out.push_back((c < 0x20 && c != '\t') || c == 0x7f ? '?' : char(c));
  return out;
}

}  // namespace

std::string DiagnosticEngine::format(const Diagnostic& d) const {
  std::string out;
  if (d.loc.file != kNoFile && d.loc.file < sources_.file_count()) {
    out = fmt::format("{}:{}:{}: {}: {}\n", sources_.name(d.loc.file), d.loc.line, d.loc.col,
                      severity_name(d.severity), d.message);
    // Huge lines are shown around the caret only.
    constexpr size_t kShown = 160;
    std::string_view line = sources_.line_text(d.loc.file, d.loc.line);
    // A column past the end (end of file, or a bad location) puts the caret just after the line.
    size_t caret = std::min<size_t>(d.loc.col > 0 ? d.loc.col - 1 : 0, line.size());
    std::string prefix, suffix;
    if (line.size() > kShown) {
      const size_t start =
          caret > kShown / 2 ? std::min(caret - kShown / 2, line.size() - kShown) : 0;
      if (start > 0) prefix = "...";
      if (start + kShown < line.size()) suffix = "...";
      line = line.substr(start, kShown);
      caret -= start;
    }
    const std::string shown = printable(line);
    out += fmt::format("  {}{}{}\n", prefix, shown, suffix);
    std::string pad;
    for (size_t i = 0; i < caret && i < shown.size(); ++i) {
      const auto c = static_cast<unsigned char>(shown[i]);
      if (c == '\t')
        pad.push_back('\t');
      else if ((c & 0xC0) != 0x80)
        pad.push_back(' ');  // UTF-8 continuation bytes take no column
    }
    out += fmt::format("  {}{}^\n", std::string(prefix.size(), ' '), pad);
  } else {
    out = fmt::format("opfuse: {}: {}\n", severity_name(d.severity), d.message);
  }
  if (!d.hint.empty()) out += fmt::format("  hint: {}\n", d.hint);
  return out;
}

std::string DiagnosticEngine::format_all() const {
  std::string out;
  for (const Diagnostic& d : diags_) out += format(d);
  if (error_count_ > error_limit_) {
    out += fmt::format("opfuse: note: {} more errors not shown (limit {})\n",
                       error_count_ - error_limit_, error_limit_);
  }
  return out;
}

}  // namespace opfuse
