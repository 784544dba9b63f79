// The statistics log's JSON lines (debug/stat_record.h): written and read back exactly, non-finite
// values included, and malformed lines rejected with a reason.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "debug/stat_record.h"

namespace opfuse::debug {
namespace {

TEST(StatRecord, JsonLineRoundTripsExactly) {
  const StatRecord r{"fc1", "activation", "", "std", 12, 0.1 + 0.2};
  const std::string line = format_json_line(r);
  EXPECT_EQ(line, R"({"layer":"fc1","tensor":"activation","gemm":null,"stat":"std","iteration":12,)"
                  R"("value":0.30000000000000004})");
  std::string error;
  const auto back = parse_json_line(line, error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(*back, r);
  EXPECT_EQ(metric_name(r), "fc1_activation_std");
}

TEST(StatRecord, NonFiniteValuesAreStrings) {
  for (const double v :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN()}) {
    const StatRecord r{"fc2", "weight", "fprop", "underflows%", 0, v};
    const std::string line = format_json_line(r);
    EXPECT_NE(line.find("\"gemm\":\"fprop\""), std::string::npos) << line;
    std::string error;
    const auto back = parse_json_line(line, error);
    ASSERT_TRUE(back) << error;
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(back->value));
    } else {
      EXPECT_EQ(back->value, v);
    }
  }
}

TEST(StatRecord, MalformedLinesSayWhy) {
  const std::pair<const char*, const char*> cases[] = {
      {"{", "not a JSON object"},
      {"[1]", "not a JSON object"},
      {R"({"tensor":"x","gemm":null,"stat":"max","iteration":1,"value":1})",
       "missing key \"layer\""},
      {R"({"layer":"a","tensor":"x","gemm":3,"stat":"max","iteration":1,"value":1})",
       "\"gemm\" must be a non-empty string or null"},
      {R"({"layer":"a","tensor":"x","gemm":null,"stat":"max","iteration":-1,"value":1})",
       "\"iteration\" must be a non-negative integer"},
      {R"({"layer":"a","tensor":"x","gemm":null,"stat":"max","iteration":1,"value":"big"})",
       "\"value\" must be a number or one of \"nan\", \"inf\", \"-inf\""},
  };
  for (const auto& [line, why] : cases) {
    std::string error;
    EXPECT_FALSE(parse_json_line(line, error)) << line;
    EXPECT_EQ(error, why) << line;
  }
}

}  // namespace
}  // namespace opfuse::debug
