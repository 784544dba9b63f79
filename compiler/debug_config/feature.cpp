#include "debug_config/feature.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

namespace opfuse::debug {

namespace {

// The first multiple of `freq` at or after `first` that is <= `last`; kNever if none.
int64_t first_multiple(int64_t first, int64_t last, int64_t freq) {
  if (first > last) return kNever;
  const int64_t r = first % freq;
  const int64_t m = r == 0 ? first : first + (freq - r);
  if (m < first || m > last) return kNever;  // m < first: overflow near kNever
  return m;
}

int64_t scalar_int(const ConfigNode& n, int64_t fallback) {
  int64_t v = fallback;
  std::from_chars(n.scalar.data(), n.scalar.data() + n.scalar.size(), v);
  return v;
}

}  // namespace

bool Cadence::runs_at(int64_t iteration) const {
  if (iteration % freq != 0) return false;
  if (start_end_list.empty()) return iteration >= start_step && iteration <= end_step;
  return std::any_of(start_end_list.begin(), start_end_list.end(), [&](const auto& se) {
    return iteration >= se.first && iteration <= se.second;
  });
}

int64_t Cadence::next_after(int64_t iteration) const {
  if (iteration == kNever) return kNever;
  if (start_end_list.empty()) {
    return first_multiple(std::max(iteration + 1, start_step), end_step, freq);
  }
  int64_t best = kNever;
  for (const auto& [s, e] : start_end_list) {
    best = std::min(best, first_multiple(std::max(iteration + 1, s), e, freq));
  }
  return best;
}

int64_t Cadence::stops_after(int64_t iteration) const {
  if (freq > 1) return iteration == kNever ? kNever : iteration + 1;
  // freq 1: runs through the end of the intervals that cover `iteration` and touch each other.
  std::vector<std::pair<int64_t, int64_t>> intervals = start_end_list;
  if (intervals.empty()) intervals.emplace_back(start_step, end_step);
  int64_t end = iteration;
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& [s, e] : intervals) {
      if (s <= (end == kNever ? end : end + 1) && e > end) {
        end = e;
        grew = true;
      }
    }
  }
  return end == kNever ? kNever : end + 1;
}

Route Cadence::route(int64_t iteration) const {
  if (runs_at(iteration)) return {true, stops_after(iteration)};
  return {false, next_after(iteration)};
}

const ConfigNode* Settings::find(std::string_view key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : it->second;
}

bool Settings::get_bool(std::string_view key, bool fallback) const {
  const ConfigNode* n = find(key);
  if (!n) return fallback;
  return yaml_bool(n->scalar).value_or(fallback);
}

int64_t Settings::get_int(std::string_view key, int64_t fallback) const {
  const ConfigNode* n = find(key);
  return n ? scalar_int(*n, fallback) : fallback;
}

double Settings::get_number(std::string_view key, double fallback) const {
  const ConfigNode* n = find(key);
  if (!n) return fallback;
  char* end = nullptr;
  const double v = std::strtod(n->scalar.c_str(), &end);
  return end == n->scalar.c_str() + n->scalar.size() && !n->scalar.empty() ? v : fallback;
}

std::string Settings::get_string(std::string_view key, std::string_view fallback) const {
  const ConfigNode* n = find(key);
  return n ? n->scalar : std::string(fallback);
}

Cadence Settings::cadence() const {
  Cadence c;
  c.freq = get_int("freq", 1);
  c.start_step = get_int("start_step", 0);
  c.end_step = get_int("end_step", kNever);
  if (const ConfigNode* list = find("start_end_list")) {
    for (const ConfigNode& item : list->items) {
      c.start_end_list.emplace_back(scalar_int(item.items.at(0), 0),
                                    scalar_int(item.items.at(1), 0));
    }
    std::sort(c.start_end_list.begin(), c.start_end_list.end());
  }
  return c;
}

std::vector<const ConfigNode*> Settings::stats(std::string_view key) const {
  std::vector<const ConfigNode*> out;
  if (const ConfigNode* list = find(key)) {
    for (const ConfigNode& item : list->items) out.push_back(&item);
  }
  return out;
}

std::vector<KeySpec> cadence_keys() {
  return {
      {"freq", KeyType::PositiveInt, {}, "run every freq-th iteration (default 1)"},
      {"start_step", KeyType::Int, {}, "first iteration (default 0)"},
      {"end_step", KeyType::Int, {}, "last iteration, inclusive (default: none)"},
      {"start_end_list",
       KeyType::IntervalList,
       {},
       "[[start, end], ...] inclusive intervals; replaces start_step and end_step"},
  };
}

float QuantizedView::dequantized(int64_t r, int64_t c) const {
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const float value = values[size_t(r * cols + c)];
  if (block_rows == 0) return value * scale_inv[0];
  const int64_t col_blocks = (cols + block_cols - 1) / block_cols;
  return value * scale_inv[size_t((r / block_rows) * col_blocks + c / block_cols)];
}

void FeatureRegistry::add(std::shared_ptr<const Feature> feature) {
  const std::string name = feature->spec().name;
  if (!features_.emplace(name, std::move(feature)).second) {
    throw std::invalid_argument(
        fmt::format("a debug feature named '{}' is registered already", name));
  }
}

const Feature* FeatureRegistry::find(std::string_view name) const {
  const auto it = features_.find(name);
  return it == features_.end() ? nullptr : it->second.get();
}

std::vector<std::string> FeatureRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : features_) out.push_back(name);
  return out;
}

}  // namespace opfuse::debug
