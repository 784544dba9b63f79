// "Did you mean" support for diagnostics.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace opfuse {

// Levenshtein distance (insertions, deletions, substitutions).
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `name`, if it is near enough to be a plausible misspelling
// (distance <= 1 for names of 3 characters or fewer, <= 2 otherwise); empty when none is.
std::string closest_spelling(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace opfuse
