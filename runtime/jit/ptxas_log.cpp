// Regex-free scanners for ptxas logs and arch names (ptxas_log.h says why).
#include "jit/ptxas_log.h"

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <optional>

namespace opfuse::jit {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }

// The decimal number that starts at `begin`, and the position after it.
std::optional<int> number_at(std::string_view text, std::size_t begin, std::size_t* end) {
  if (begin >= text.size() || !is_digit(text[begin])) return std::nullopt;
  int value = 0;
  const auto [ptr, ec] = std::from_chars(text.data() + begin, text.data() + text.size(), value);
  if (ec != std::errc()) return std::nullopt;
  *end = static_cast<std::size_t>(ptr - text.data());
  return value;
}

// The decimal number that ends right before `end`.
std::optional<int> number_before(std::string_view text, std::size_t end) {
  std::size_t begin = end;
  while (begin > 0 && is_digit(text[begin - 1])) --begin;
  std::size_t after = 0;
  const std::optional<int> value = number_at(text, begin, &after);
  return value && after == end ? value : std::nullopt;
}

// "S bytes spill stores, L bytes spill loads" around the match of kStores at `at`.
constexpr std::string_view kStores = " bytes spill stores, ";
constexpr std::string_view kLoads = " bytes spill loads";
std::optional<LogFunctionSpills> spills_at(std::string_view text, std::size_t at) {
  const std::optional<int> stores = number_before(text, at);
  std::size_t after = 0;
  const std::optional<int> loads = number_at(text, at + kStores.size(), &after);
  if (!stores || !loads || text.substr(after, kLoads.size()) != kLoads) return std::nullopt;
  return LogFunctionSpills{{}, *stores, *loads};
}

}  // namespace

bool is_arch_name(std::string_view arch) {
  std::string_view rest;
  if (arch.starts_with("sm_")) {
    rest = arch.substr(3);
  } else if (arch.starts_with("compute_")) {
    rest = arch.substr(8);
  } else {
    return false;
  }
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) rest.remove_suffix(1);
  return !rest.empty() && std::all_of(rest.begin(), rest.end(), is_digit);
}

int log_largest_registers(std::string_view log) {
  constexpr std::string_view kUsed = "Used ";
  constexpr std::string_view kRegisters = " registers";
  int largest = -1;
  for (std::size_t at = log.find(kUsed); at != std::string_view::npos;
       at = log.find(kUsed, at + 1)) {
    std::size_t after = 0;
    const std::optional<int> value = number_at(log, at + kUsed.size(), &after);
    if (value && log.substr(after, kRegisters.size()) == kRegisters)
      largest = std::max(largest, *value);
  }
  return largest;
}

LogSpills log_largest_spills(std::string_view log) {
  LogSpills largest;
  for (std::size_t at = log.find(kStores); at != std::string_view::npos;
       at = log.find(kStores, at + 1)) {
    if (const std::optional<LogFunctionSpills> spills = spills_at(log, at)) {
      largest.store_bytes = std::max(largest.store_bytes, spills->store_bytes);
      largest.load_bytes = std::max(largest.load_bytes, spills->load_bytes);
    }
  }
  return largest;
}

std::vector<LogFunctionSpills> log_function_spills(std::string_view log) {
  constexpr std::string_view kProperties = "Function properties for ";
  constexpr std::string_view kFrame = " bytes stack frame, ";
  std::vector<LogFunctionSpills> blocks;
  for (std::size_t at = log.find(kProperties); at != std::string_view::npos;
       at = log.find(kProperties, at + 1)) {
    std::size_t end = at + kProperties.size();
    while (end < log.size() && !is_space(log[end])) ++end;
    const std::string_view name =
        log.substr(at + kProperties.size(), end - at - kProperties.size());
    // The rest of the name's line must be blank; the block's numbers are on the next line that is
    // not blank.
    std::size_t line = end;
    while (line < log.size() && is_space(log[line]) && log[line] != '\n') ++line;
    if (name.empty() || line >= log.size() || log[line] != '\n') continue;
    while (line < log.size() && is_space(log[line])) ++line;
    const std::size_t line_end = std::min(log.find('\n', line), log.size());
    const std::string_view numbers = log.substr(line, line_end - line);
    const std::size_t frame = numbers.find(kFrame);
    std::size_t stores = 0;
    if (frame == std::string_view::npos || !number_before(numbers, frame) ||
        !number_at(numbers, frame + kFrame.size(), &stores))
      continue;
    // "N bytes stack frame, S bytes spill stores, L bytes spill loads": S ends where kStores
    // starts.
    if (numbers.substr(stores, kStores.size()) != kStores) continue;
    if (std::optional<LogFunctionSpills> spills = spills_at(numbers, stores)) {
      spills->function = std::string(name);
      blocks.push_back(std::move(*spills));
    }
  }
  return blocks;
}

}  // namespace opfuse::jit
