#include "support/spelling.h"

#include <algorithm>

namespace opfuse {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_spelling(std::string_view name, const std::vector<std::string>& candidates) {
  // Every one-letter name is one edit from every other: no suggestion is meaningful.
  if (name.size() <= 1) return {};
  std::string best;
  size_t best_distance = name.size() <= 3 ? 2 : 3;
  for (const std::string& c : candidates) {
    // Cheap bound first: hostile inputs can have very long names.
    const size_t length_gap =
        c.size() > name.size() ? c.size() - name.size() : name.size() - c.size();
    if (length_gap >= best_distance) continue;
    const size_t d = edit_distance(name, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace opfuse
