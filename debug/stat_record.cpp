#include "debug/stat_record.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace opfuse::debug {

std::string metric_name(const StatRecord& r) {
  return fmt::format("{}_{}_{}", r.layer, r.tensor, r.stat);
}

std::string format_json_line(const StatRecord& r) {
  nlohmann::ordered_json j;
  j["layer"] = r.layer;
  j["tensor"] = r.tensor;
  j["gemm"] = r.gemm.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.gemm);
  j["stat"] = r.stat;
  j["iteration"] = r.iteration;
  if (std::isnan(r.value)) {
    j["value"] = "nan";
  } else if (std::isinf(r.value)) {
    j["value"] = r.value > 0 ? "inf" : "-inf";
  } else {
    j["value"] = r.value;  // shortest text that reads back to the same double
  }
  return j.dump();
}

namespace {

bool string_field(const nlohmann::json& j, const char* key, std::string& out, std::string& error,
                  bool nullable = false) {
  const auto it = j.find(key);
  if (it == j.end()) {
    error = fmt::format("missing key \"{}\"", key);
    return false;
  }
  if (nullable && it->is_null()) {
    out.clear();
    return true;
  }
  if (!it->is_string() || it->get_ref<const std::string&>().empty()) {
    error = fmt::format("\"{}\" must be a non-empty string{}", key, nullable ? " or null" : "");
    return false;
  }
  out = it->get<std::string>();
  return true;
}

}  // namespace

std::optional<StatRecord> parse_json_line(std::string_view line, std::string& error) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  if (!j.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  StatRecord r;
  if (!string_field(j, "layer", r.layer, error) || !string_field(j, "tensor", r.tensor, error) ||
      !string_field(j, "gemm", r.gemm, error, /*nullable=*/true) ||
      !string_field(j, "stat", r.stat, error)) {
    return std::nullopt;
  }
  const auto it = j.find("iteration");
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    error = "\"iteration\" must be a non-negative integer";
    return std::nullopt;
  }
  r.iteration = it->get<int64_t>();
  const auto v = j.find("value");
  if (v == j.end()) {
    error = "missing key \"value\"";
    return std::nullopt;
  }
  if (v->is_number()) {
    r.value = v->get<double>();
  } else if (v->is_string() && (*v == "nan" || *v == "inf" || *v == "-inf")) {
    const std::string& s = v->get_ref<const std::string&>();
    r.value = s == "nan"   ? std::numeric_limits<double>::quiet_NaN()
              : s == "inf" ? std::numeric_limits<double>::infinity()
                           : -std::numeric_limits<double>::infinity();
  } else {
    error = "\"value\" must be a number or one of \"nan\", \"inf\", \"-inf\"";
    return std::nullopt;
  }
  return r;
}

}  // namespace opfuse::debug
