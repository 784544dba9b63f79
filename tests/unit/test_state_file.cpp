// State (checkpoint) files: exact round trips, refusal of truncated, damaged, foreign and newer
// files with messages that name the file, layout mismatches listed in full, atomic replacement
// that keeps the old file when a write fails. Also: the runtime's errors share one base class.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/state_file.h"
#include "driver/compile.h"
#include "gpu/binding_check.h"
#include "jit/nvrtc_compiler.h"
#include "jit/sha256.h"
#include "opfuse/error.h"
#include "plan/parallel.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse::api {
namespace {

namespace fs = std::filesystem;

std::vector<unsigned char> pattern_bytes(std::size_t n, std::size_t seed) {
  std::vector<unsigned char> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 131 + seed * 7);
  return bytes;
}

StateTensor tensor(const std::string& name, ir::DType dtype, std::vector<std::int64_t> shape,
                   std::size_t seed) {
  std::size_t n = static_cast<std::size_t>(ir::dtype_bytes(dtype));
  for (const std::int64_t dim : shape) n *= static_cast<std::size_t>(dim);
  return {name, dtype, std::move(shape), pattern_bytes(n, seed), {}};
}

StateQuantizer quantizer(const std::string& name, std::size_t history_length, float first_amax) {
  StateQuantizer q{name, {}};
  q.state.amax_history.resize(history_length);
  for (std::size_t i = 0; i < history_length; ++i) {
    q.state.amax_history[i] = first_amax + static_cast<float>(i) * 0.25f;
  }
  q.state.scale = 448.0f / first_amax;
  q.state.scale_inv = first_amax / 448.0f;
  return q;
}

constexpr const char* kSampleRecipe = "delayed(history=1024, algo=max, margin=0, format=HYBRID)";

// Parameters of several dtypes (one empty), quantizers with the shortest and the default history,
// and values JSON could not hold (NaN, Inf, a denormal) to show the payload keeps exact bits.
StateFile sample_state() {
  StateFile state;
  state.program = "mlp.fuse:mlp";
  state.recipe = kSampleRecipe;
  state.step = 1234567890123;
  state.tensors = {
      tensor("fc1.weight", ir::DType::BF16, {3, 5}, 1), tensor("fc1.bias", ir::DType::FP32, {7}, 2),
      tensor("fc1.weight_fp8", ir::DType::E4M3, {2, 3, 4}, 3),
      tensor("empty", ir::DType::E5M2, {0, 9}, 4), tensor("norm.gamma", ir::DType::FP16, {33}, 5)};
  state.quantizers = {quantizer("fc1.input", 1, 3.5f), quantizer("fc1.weight", 1024, 0.125f)};
  state.quantizers[1].state.amax_history[5] = std::numeric_limits<float>::quiet_NaN();
  state.quantizers[1].state.amax_history[6] = std::numeric_limits<float>::infinity();
  state.quantizers[1].state.amax_history[7] = std::numeric_limits<float>::denorm_min();
  // The largest count a measurement counter reaches before it wraps (stochastic rounding's step).
  state.quantizers[0].state.measurements = 0xFFFFFFFFu;
  state.quantizers[1].state.measurements = 17;
  return state;
}

// Float lists compared bit for bit (NaN == NaN here).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string read_bytes(const std::string& path) { return test::read_text(path); }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// What read_state_file throws for the file at `path` ("" if it reads fine).
std::string read_error(const std::string& path) {
  try {
    read_state_file(path);
  } catch (const StateFileError& error) {
    return error.what();
  }
  return "";
}

std::string saved_sample(const std::string& tag) {
  std::string path = test::make_temp_dir(tag) + "/model.state";
  write_state_file(path, sample_state());
  return path;
}

// A file in the documented layout with this header text and payload and a correct checksum, for
// headers that only a faulty writer would produce.
std::string assemble(const std::string& header, const std::string& payload) {
  std::string out("OPFSTAT\n", 8);
  const auto append_le = [&out](std::uint64_t value, int width) {
    for (int i = 0; i < width; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
  };
  append_le(kStateFileFormatVersion, 4);
  append_le(0, 4);
  append_le(header.size(), 8);
  append_le(payload.size(), 8);
  out += header;
  out += payload;
  jit::Sha256 hasher;
  hasher.update(out);
  const jit::Sha256Digest digest = hasher.finish();
  out.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  return out;
}

TEST(StateFile, RoundTripKeepsEveryByteAndBit) {
  const StateFile written = sample_state();
  const StateFile read = read_state_file(saved_sample("state-roundtrip"));
  EXPECT_EQ(read.program, written.program);
  EXPECT_EQ(read.recipe, written.recipe);
  EXPECT_EQ(read.step, written.step);
  ASSERT_EQ(read.tensors.size(), written.tensors.size());
  for (std::size_t i = 0; i < written.tensors.size(); ++i) {
    SCOPED_TRACE(written.tensors[i].name);
    EXPECT_EQ(read.tensors[i].name, written.tensors[i].name);
    EXPECT_EQ(read.tensors[i].dtype, written.tensors[i].dtype);
    EXPECT_EQ(read.tensors[i].shape, written.tensors[i].shape);
    EXPECT_EQ(read.tensors[i].bytes, written.tensors[i].bytes);
  }
  ASSERT_EQ(read.quantizers.size(), written.quantizers.size());
  for (std::size_t i = 0; i < written.quantizers.size(); ++i) {
    SCOPED_TRACE(written.quantizers[i].name);
    const cpu::DelayedScalingState& got = read.quantizers[i].state;
    const cpu::DelayedScalingState& want = written.quantizers[i].state;
    EXPECT_EQ(read.quantizers[i].name, written.quantizers[i].name);
    EXPECT_TRUE(same_bits(got.amax_history, want.amax_history));
    EXPECT_TRUE(same_bits({got.scale, got.scale_inv}, {want.scale, want.scale_inv}));
    EXPECT_EQ(got.measurements, want.measurements);
  }
  EXPECT_EQ(read.quantizers[1].state.amax_history.size(), 1024u);
  EXPECT_TRUE(std::isnan(read.quantizers[1].state.amax_history[5]));
}

TEST(StateFile, PayloadItemsStartOnSixtyFourByteBoundaries) {
  // The docs promise aligned items so a loader can copy or map them directly.
  const std::string bytes = read_bytes(saved_sample("state-aligned"));
  for (const StateTensor& t : sample_state().tensors) {
    if (t.bytes.empty()) continue;
    const std::size_t at = bytes.find(std::string(t.bytes.begin(), t.bytes.end()));
    ASSERT_NE(at, std::string::npos) << t.name;
    EXPECT_EQ(at % 64, 0u) << t.name << " at " << at;
  }
}

TEST(StateFile, TruncatedFileIsRefusedAtEveryCut) {
  const std::string path = saved_sample("state-truncated");
  const std::string whole = read_bytes(path);
  const std::vector<std::size_t> cuts = {
      0, 3, 8, 12, 20, 31, 32, 100, 640, 700, 900, 4000, whole.size() - 32, whole.size() - 1};
  for (const std::size_t cut : cuts) {
    ASSERT_LT(cut, whole.size());
    write_bytes(path, whole.substr(0, cut));
    const std::string message = read_error(path);
    EXPECT_NE(message.find("state file " + path + " is truncated: it has " + std::to_string(cut) +
                           " bytes"),
              std::string::npos)
        << "cut at " << cut << ": " << message;
    EXPECT_NE(message.find("use a complete copy"), std::string::npos) << message;
  }
}

TEST(StateFile, FlippedBitInHeaderPayloadOrChecksumIsDamage) {
  const std::string path = saved_sample("state-bitflip");
  const std::string whole = read_bytes(path);
  const std::size_t in_header = whole.find("fc1.bias");
  const std::vector<unsigned char> fp8_bytes = sample_state().tensors[2].bytes;
  const std::size_t fp8_at = whole.find(std::string(fp8_bytes.begin(), fp8_bytes.end()));
  ASSERT_NE(fp8_at, std::string::npos);
  const std::size_t in_payload = fp8_at + 5;
  const std::size_t in_checksum = whole.size() - 7;
  ASSERT_NE(in_header, std::string::npos);
  for (const std::size_t at : {in_header, in_payload, in_checksum}) {
    std::string damaged = whole;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x10);
    write_bytes(path, damaged);
    const std::string message = read_error(path);
    EXPECT_NE(message.find("state file " + path + " is damaged: checksum mismatch"),
              std::string::npos)
        << "bit flipped at " << at << ": " << message;
    EXPECT_NE(message.find("restore it from a good copy"), std::string::npos) << message;
  }
}

TEST(StateFile, ForeignFileIsNotAStateFile) {
  const std::string path = saved_sample("state-magic");
  std::string bytes = read_bytes(path);
  bytes[0] = 'X';
  write_bytes(path, bytes);
  EXPECT_NE(read_error(path).find(path + " is not an opfuse state file"), std::string::npos)
      << read_error(path);
  write_bytes(path, "{\"program\": \"mlp\"}\n");
  EXPECT_NE(read_error(path).find(path + " is not an opfuse state file"), std::string::npos)
      << read_error(path);
}

TEST(StateFile, NewerVersionNamesBothVersions) {
  const std::string path = saved_sample("state-version");
  std::string bytes = read_bytes(path);
  bytes[8] = static_cast<char>(kStateFileFormatVersion + 1);
  write_bytes(path, bytes);
  EXPECT_NE(read_error(path).find("state file " + path +
                                  " was written by a newer opfuse: format version " +
                                  std::to_string(kStateFileFormatVersion + 1) +
                                  ", this build reads " + std::to_string(kStateFileFormatVersion)),
            std::string::npos)
      << read_error(path);
}

TEST(StateFile, TrailingBytesAreDamage) {
  const std::string path = saved_sample("state-trailing");
  write_bytes(path, read_bytes(path) + "extra");
  EXPECT_NE(read_error(path).find("is damaged: it has 5 bytes after the end"), std::string::npos)
      << read_error(path);
}

TEST(StateFile, MissingFileNamesPathAndReason) {
  const std::string path = test::make_temp_dir("state-missing") + "/absent.state";
  EXPECT_NE(read_error(path).find("cannot read state file " + path + ": No such file"),
            std::string::npos)
      << read_error(path);
}

TEST(StateFile, HeaderThatBreaksTheSchemaIsRefused) {
  const std::string payload(64, '\0');
  // Lists are passed as initializer lists: a one-element braced list would otherwise become its
  // element rather than an array.
  using List = std::initializer_list<nlohmann::json>;
  const auto header = [](List tensors, List quantizers) {
    return nlohmann::json{{"program", "p"},
                          {"recipe", "r"},
                          {"step", 3},
                          {"tensors", tensors},
                          {"quantizers", quantizers}}
        .dump();
  };
  const auto t = [](const char* dtype, std::vector<int> shape, int offset, int size) {
    return nlohmann::json{
        {"name", "w"}, {"dtype", dtype}, {"shape", shape}, {"offset", offset}, {"size", size}};
  };
  const List none = {};
  struct Case {
    std::string header;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"{not json", "the header is not JSON"},
      {"[1, 2]", "the header is not a JSON object"},
      {R"({"program": "p", "recipe": "r", "tensors": [], "quantizers": []})",
       "header has no field 'step'"},
      {R"({"program": "p", "recipe": "r", "step": -1, "tensors": [], "quantizers": []})",
       "header.step is not a non-negative 64-bit integer"},
      {header({t("int7", {4}, 0, 4)}, none), "tensors[0].dtype 'int7' is not a dtype"},
      {header({t("fp32", {4}, 0, 12)}, none),
       "tensors[0] ('w') has size 12, but [4] of fp32 needs 16"},
      {header({t("fp32", {4}, 56, 16)}, none), "tensors[0] ('w') lies outside the payload"},
      {header({t("fp32", {-4}, 0, 16)}, none), "tensors[0].shape holds something other than"},
      {header({t("bf16", {4}, 0, 8), t("bf16", {4}, 16, 8)}, none), "two tensors are named 'w'"},
      {header(none, {{{"name", "q"}, {"history_length", 0}, {"offset", 0}}}),
       "quantizers[0] ('q') has history length 0"},
      {header({t("bf16", {8}, 0, 16)}, {{{"name", "q"}, {"history_length", 2}, {"offset", 8}}}),
       "tensors[0] ('w') and quantizers[0] ('q') overlap in the payload"},
      {header(none, {{{"name", "q"}, {"history_length", 1}, {"offset", 0}, {"measurements", -1}}}),
       "quantizers[0].measurements is not a non-negative 64-bit integer"},
      {header(none, {{{"name", "q"}, {"history_length", 1}, {"offset", 0}, {"measurements", "7"}}}),
       "quantizers[0].measurements is not a non-negative 64-bit integer"},
      {header(
           none,
           {{{"name", "q"}, {"history_length", 1}, {"offset", 0}, {"measurements", 4294967296LL}}}),
       "quantizers[0].measurements is 4294967296, more than a 32-bit count holds"},
  };
  const std::string path = test::make_temp_dir("state-schema") + "/crafted.state";
  for (const Case& c : cases) {
    write_bytes(path, assemble(c.header, payload));
    const std::string message = read_error(path);
    EXPECT_NE(message.find("state file " + path + " is damaged: " + c.expected), std::string::npos)
        << "header " << c.header << "\nmessage: " << message;
  }
  // The same layout with a consistent header reads: the cases above fail only for their defect.
  write_bytes(path, assemble(header({t("bf16", {8}, 0, 16)},
                                    {{{"name", "q"}, {"history_length", 2}, {"offset", 16}}}),
                             payload));
  EXPECT_EQ(read_error(path), "");
}

// Files written before the measurement counts were saved (the same version, no "measurements"
// key): they read, and their quantizers count from 0 again, as such a file always resumed.
TEST(StateFile, FileWithoutMeasurementCountsReadsThemAsZero) {
  const nlohmann::json old_quantizer = {{"name", "q"}, {"history_length", 1}, {"offset", 0}};
  const std::string header = nlohmann::json{{"program", "p"},
                                            {"recipe", "r"},
                                            {"step", 3},
                                            {"tensors", nlohmann::json::array()},
                                            {"quantizers", nlohmann::json::array({old_quantizer})}}
                                 .dump();
  std::string payload(64, '\0');
  const float values[3] = {2.0f, 0.5f, 7.0f};  // scale, scale_inv, amax
  std::memcpy(payload.data(), values, sizeof values);
  const std::string path = test::make_temp_dir("state-old") + "/old.state";
  write_bytes(path, assemble(header, payload));
  const StateFile read = read_state_file(path);
  ASSERT_EQ(read.quantizers.size(), 1u);
  EXPECT_EQ(read.quantizers[0].state.measurements, 0u);
  EXPECT_EQ(read.quantizers[0].state.scale, 2.0f);
  EXPECT_EQ(read.quantizers[0].state.amax_history, std::vector<float>{7.0f});
  // And this build writes the key for every quantizer, so the count survives a round trip.
  const std::string saved = read_bytes(saved_sample("state-measurements"));
  EXPECT_NE(saved.find("\"measurements\": 4294967295"), std::string::npos);
}

StateFile expected_layout() {
  StateFile expected = sample_state();
  for (StateTensor& t : expected.tensors) t.bytes.clear();  // layout only
  return expected;
}

TEST(StateFile, MatchingLayoutHasNoMismatches) {
  StateFile file = sample_state();
  file.step = 7;                                // progress differs, layout does not
  std::swap(file.tensors[0], file.tensors[3]);  // matched by name, not position
  EXPECT_EQ(state_mismatches(file, expected_layout()), std::vector<std::string>{});
  EXPECT_NO_THROW(require_state_fits(file, expected_layout(), "model.state"));
}

// The quantizer state alone (StateParts::Quantizers, opfuse.torch's extra state): it round-trips
// with "contents": "quantizers", loads as the quantizer state of a whole checkpoint's layout and
// is refused by a load that needs the parameters; a whole checkpoint loads as quantizers only.
TEST(StateFile, QuantizersOnlyFileRoundTripsAndLoadsOnlyAsQuantizers) {
  StateFile written = sample_state();
  written.tensors.clear();
  written.quantizers_only = true;
  const std::string path = test::make_temp_dir("state-quantizers") + "/quantizers.state";
  write_state_file(path, written);
  EXPECT_NE(read_bytes(path).find("\"contents\": \"quantizers\""), std::string::npos);
  const StateFile read = read_state_file(path);
  EXPECT_TRUE(read.quantizers_only);
  EXPECT_TRUE(read.tensors.empty());
  ASSERT_EQ(read.quantizers.size(), written.quantizers.size());
  EXPECT_TRUE(
      same_bits(read.quantizers[1].state.amax_history, written.quantizers[1].state.amax_history));
  EXPECT_EQ(read.step, written.step);

  // A whole load needs the parameters: refused with the reason, not as missing tensors alone.
  const std::vector<std::string> whole = state_mismatches(read, expected_layout());
  ASSERT_FALSE(whole.empty());
  EXPECT_NE(whole[0].find("holds the quantizer state only"), std::string::npos) << whole[0];
  // A quantizers-only load compares the quantizers and nothing of the tensors.
  StateFile quantizers_wanted = expected_layout();
  quantizers_wanted.tensors.clear();
  quantizers_wanted.quantizers_only = true;
  EXPECT_EQ(state_mismatches(read, quantizers_wanted), std::vector<std::string>{});
  EXPECT_EQ(state_mismatches(sample_state(), quantizers_wanted), std::vector<std::string>{});
  // ... but still the quantizers: a different history length is a mismatch.
  StateFile longer = read;
  longer.quantizers[0].state.amax_history.resize(4);
  const std::vector<std::string> reasons = state_mismatches(longer, quantizers_wanted);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("quantizer 'fc1.input' has amax history length 4"), std::string::npos)
      << reasons[0];

  // A writer cannot mix the two, and a reader refuses a header that does.
  StateFile mixed = sample_state();
  mixed.quantizers_only = true;
  try {
    write_state_file(path + ".mixed", mixed);
    ADD_FAILURE() << "a quantizers-only state with tensors was written";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("holds the quantizer state only, yet has 5 tensors"),
              std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(fs::exists(path + ".mixed"));
  const std::string payload(64, '\0');
  const auto header = [](const char* contents, bool with_tensor) {
    nlohmann::json tensors = nlohmann::json::array();
    if (with_tensor) {
      tensors.push_back(
          {{"name", "w"}, {"dtype", "bf16"}, {"shape", {8}}, {"offset", 0}, {"size", 16}});
    }
    return nlohmann::json{{"program", "p"},     {"recipe", "r"},
                          {"step", 3},          {"contents", contents},
                          {"tensors", tensors}, {"quantizers", nlohmann::json::array()}}
        .dump();
  };
  write_bytes(path, assemble(header("quantizers", true), payload));
  EXPECT_NE(read_error(path).find("it says it holds the quantizer state only, yet lists 1 tensors"),
            std::string::npos)
      << read_error(path);
  write_bytes(path, assemble(header("weights", false), payload));
  EXPECT_NE(read_error(path).find("contents is 'weights', not 'all' or 'quantizers'"),
            std::string::npos)
      << read_error(path);
  write_bytes(path, assemble(header("all", true), payload));
  EXPECT_EQ(read_error(path), "");
}

// A tensor-parallel run's checkpoint holds one rank's shards (docs/parallel.md): the rank and
// group size round-trip and a file loads only into the same rank of the same group size.
TEST(StateFile, TensorParallelRankRoundTripsAndLoadsOnlyIntoItsRank) {
  StateFile file = sample_state();
  file.tp = 2;
  file.rank = 1;
  const std::string path = test::make_temp_dir("tp_rank") + "/model.state";
  write_state_file(path, file);
  const StateFile back = read_state_file(path);
  EXPECT_EQ(back.tp, 2);
  EXPECT_EQ(back.rank, 1);
  StateFile rank0 = expected_layout();
  rank0.tp = 2;
  rank0.rank = 0;
  const std::vector<std::string> reasons = state_mismatches(back, rank0);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0],
            "it holds rank 1 of 2 ranks' shards, this session needs rank 0 of 2 ranks' shards (a "
            "tensor-parallel checkpoint loads into the same rank of the same group size)");
  const std::vector<std::string> whole = state_mismatches(back, expected_layout());
  ASSERT_FALSE(whole.empty());
  EXPECT_TRUE(test::contains(whole[0], "this session needs one rank's whole parameters"));
  rank0.rank = 1;
  EXPECT_EQ(state_mismatches(back, rank0), std::vector<std::string>{});
  // A one-rank file has no parallel key: the format of a plain program's files is unchanged.
  write_state_file(path, sample_state());
  EXPECT_EQ(read_state_file(path).tp, 1);
}

// Merging a tensor-parallel run's rank files (fusec merge-state): the sharded tensors joined as
// plan::join_shards cuts them, the rest taken once; files of different runs, a missing rank and
// replicated tensors or quantizers that differ between ranks refused.
TEST(StateFile, RankFilesMergeIntoTheWholeParameters) {
  StateFile whole;
  whole.program = "mlp_tp.fuse:mlp";
  whole.recipe = "bf16";
  whole.step = 3;
  std::vector<std::uint16_t> w(16);  // [8, 2]
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::uint16_t>(i + 1);
  StateTensor weight{"fc1.weight", plan::DType::BF16, {8, 2}, {}, {}};
  weight.bytes.resize(w.size() * 2);
  std::memcpy(weight.bytes.data(), w.data(), weight.bytes.size());
  StateTensor gamma{"norm.weight", plan::DType::FP32, {2}, std::vector<unsigned char>(8, 7), {}};
  const plan::ShardSpec gated{0, 2};
  std::vector<StateFile> ranks;
  for (int r = 0; r < 2; ++r) {
    StateFile f = whole;
    f.tp = 2;
    f.rank = r;
    const std::vector<std::uint16_t> part = plan::take_shard<std::uint16_t>(w, {8, 2}, gated, 2, r);
    StateTensor shard{"fc1.weight", plan::DType::BF16, {4, 2}, {}, gated};
    shard.bytes.resize(part.size() * 2);
    std::memcpy(shard.bytes.data(), part.data(), shard.bytes.size());
    f.tensors = {shard, gamma};
    // Slot 0 is the step in progress, each rank's own amax; slot 1 was reduced at the last step.
    f.quantizers = {{"fc1.input", {{r == 0 ? 1.5f : 2.5f, 3.0f}, 2.0f, 0.5f}}};
    ranks.push_back(f);
  }
  // Through files: the shard specs round-trip.
  const std::string dir = test::make_temp_dir("merge_ranks");
  write_state_file(dir + "/r1.state", ranks[1]);
  ranks[1] = read_state_file(dir + "/r1.state");
  EXPECT_EQ(ranks[1].tensors[0].shard, gated);
  const StateFile merged = merge_state_shards({ranks[1], ranks[0]}, "mlp.fuse:mlp");
  EXPECT_EQ(merged.tp, 1);
  EXPECT_EQ(merged.program, "mlp.fuse:mlp");
  EXPECT_EQ(merged.step, 3);
  ASSERT_EQ(merged.tensors.size(), 2u);
  EXPECT_EQ(merged.tensors[0].shape, (std::vector<std::int64_t>{8, 2}));
  EXPECT_EQ(merged.tensors[0].bytes, weight.bytes);
  EXPECT_FALSE(merged.tensors[0].shard.sharded());
  EXPECT_EQ(merged.tensors[1].bytes, gamma.bytes);
  ASSERT_EQ(merged.quantizers.size(), 1u);
  EXPECT_EQ(merged.quantizers[0].state.amax_history, (std::vector<float>{2.5f, 3.0f}));
  StateFile unreduced = ranks[1];
  unreduced.quantizers[0].state.amax_history[1] = 4.0f;
  EXPECT_THROW((void)merge_state_shards({ranks[0], unreduced}), UsageError);

  EXPECT_THROW((void)merge_state_shards({ranks[0]}), UsageError);            // a rank missing
  EXPECT_THROW((void)merge_state_shards({ranks[0], ranks[0]}), UsageError);  // one rank twice
  StateFile drifted = ranks[1];
  drifted.tensors[1].bytes[0] = 9;  // a replicated tensor that differs
  try {
    (void)merge_state_shards({ranks[0], drifted});
    FAIL() << "differing replicated tensors merged";
  } catch (const UsageError& e) {
    EXPECT_TRUE(test::contains(e.what(), "'norm.weight' is replicated but differs")) << e.what();
  }
  StateFile other_step = ranks[1];
  other_step.step = 4;
  EXPECT_THROW((void)merge_state_shards({ranks[0], other_step}), UsageError);
}

// Splitting a one-rank file into a tensor-parallel program's rank files (fusec split-state): each
// cut tensor as plan::take_shard cuts it, the rest and the quantizers whole on every rank, and the
// ranks' files merge back into the same bytes.
TEST(StateFile, OneRankFileSplitsIntoRankFilesThatMergeBack) {
  StateFile whole;
  whole.program = "mlp.fuse:mlp";
  whole.recipe = "delayed_scaling(...)";
  whole.step = 7;
  const auto tensor = [](std::string name, plan::DType dtype, std::vector<std::int64_t> shape) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    StateTensor t{std::move(name), dtype, std::move(shape), {}, {}};
    t.bytes.resize(static_cast<std::size_t>(n * plan::dtype_bytes(dtype)));
    for (std::size_t i = 0; i < t.bytes.size(); ++i)
      t.bytes[i] = static_cast<unsigned char>(i * 7 + t.name.size());
    return t;
  };
  whole.tensors = {tensor("fc1.weight", plan::DType::BF16, {8, 4}),
                   tensor("fc2.weight", plan::DType::BF16, {4, 4}),
                   tensor("norm.weight", plan::DType::FP32, {4})};
  whole.quantizers = {{"fc1.input", {{1.5f, 3.0f}, 2.0f, 0.5f}}};
  const std::map<std::string, plan::ShardSpec> shards = {
      {"fc1.weight", {0, 2}}, {"fc2.weight", {1, 1}}, {"norm.weight", {}}};
  const std::vector<StateFile> ranks = split_state_file(whole, 2, shards, "mlp_tp.fuse:mlp_tp2");
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const StateFile& f = ranks[static_cast<std::size_t>(r)];
    EXPECT_EQ(f.tp, 2);
    EXPECT_EQ(f.rank, r);
    EXPECT_EQ(f.program, "mlp_tp.fuse:mlp_tp2");
    EXPECT_EQ(f.recipe, whole.recipe);
    EXPECT_EQ(f.step, 7);
    ASSERT_EQ(f.tensors.size(), 3u);
    EXPECT_EQ(f.tensors[0].shape, (std::vector<std::int64_t>{4, 4}));
    EXPECT_EQ(f.tensors[0].shard, (plan::ShardSpec{0, 2}));
    std::vector<std::uint16_t> w(32);
    std::memcpy(w.data(), whole.tensors[0].bytes.data(), 64);
    const std::vector<std::uint16_t> mine =
        plan::take_shard<std::uint16_t>(w, {8, 4}, plan::ShardSpec{0, 2}, 2, r);
    ASSERT_EQ(f.tensors[0].bytes.size(), mine.size() * 2);
    EXPECT_EQ(std::memcmp(f.tensors[0].bytes.data(), mine.data(), 32), 0);
    EXPECT_EQ(f.tensors[1].shape, (std::vector<std::int64_t>{4, 2}));
    EXPECT_EQ(f.tensors[2].bytes, whole.tensors[2].bytes);
    EXPECT_FALSE(f.tensors[2].shard.sharded());
    EXPECT_EQ(f.quantizers[0].state.amax_history, whole.quantizers[0].state.amax_history);
  }
  // Through files, then merged back: the same bytes.
  const std::string dir = test::make_temp_dir("split_ranks");
  std::vector<StateFile> read;
  for (const StateFile& f : ranks) {
    const std::string path = dir + "/rank" + std::to_string(f.rank) + ".state";
    write_state_file(path, f);
    read.push_back(read_state_file(path));
  }
  const StateFile merged = merge_state_shards(read, "mlp.fuse:mlp");
  ASSERT_EQ(merged.tensors.size(), whole.tensors.size());
  for (std::size_t i = 0; i < whole.tensors.size(); ++i) {
    EXPECT_EQ(merged.tensors[i].shape, whole.tensors[i].shape) << i;
    EXPECT_EQ(merged.tensors[i].bytes, whole.tensors[i].bytes) << i;
  }
  EXPECT_EQ(merged.quantizers[0].state.amax_history, whole.quantizers[0].state.amax_history);

  const auto refusal = [&](const StateFile& file, int tp,
                           const std::map<std::string, plan::ShardSpec>& cuts) {
    try {
      (void)split_state_file(file, tp, cuts, "mlp_tp.fuse:mlp_tp2");
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(split)");
  };
  EXPECT_TRUE(test::contains(refusal(ranks[0], 2, shards), "merge the ranks' files first"));
  EXPECT_TRUE(test::contains(refusal(whole, 1, shards), "tp >= 2"));
  std::map<std::string, plan::ShardSpec> more = shards;
  more["fc3.weight"] = {0, 1};
  EXPECT_TRUE(test::contains(refusal(whole, 2, more), "lacks parameter 'fc3.weight'"));
  std::map<std::string, plan::ShardSpec> fewer = shards;
  fewer.erase("norm.weight");
  EXPECT_TRUE(test::contains(refusal(whole, 2, fewer), "'norm.weight' is not a parameter"));
  const std::string three = refusal(whole, 3, shards);  // 8 rows in 2 blocks over 3 ranks
  EXPECT_TRUE(test::contains(three, "'fc1.weight' cannot be cut over 3 ranks")) << three;
  EXPECT_TRUE(test::contains(three, "'fc2.weight' cannot be cut over 3 ranks")) << three;
}

// The layout a rank's session saves and loads (Session::save / load, fusec split-state): the
// parameters in buffer order with the sizes given and their cuts, every quantizer with its history.
TEST(StateFile, PlanLayoutListsTheParametersWithTheirCutsAndTheQuantizers) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Plan;
  const driver::CompileResult r = driver::compile_source("tp.fuse", R"(
recipe delayed = delayed_scaling(amax_history = 4)
sequence mlp_tp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses delayed with parallel(tp = 2, sp = false) {
  layernorm(64)
  linear(64, 256, parallel = column) as fc1
  swiglu()
  linear(128, 64, parallel = row) as fc2
}
)",
                                                         sources, diags, options);
  ASSERT_TRUE(r.ok()) << diags.format_all();
  const plan::SequencePlan& plan = r.plan.sequences.at(0);
  std::vector<std::string> asked;
  const StateFile layout = plan_state_layout(plan, "tp.fuse:mlp_tp", 1, [&](const plan::Buffer& b) {
    asked.push_back(b.name);
    return std::vector<std::int64_t>{static_cast<std::int64_t>(asked.size())};
  });
  EXPECT_EQ(layout.program, "tp.fuse:mlp_tp");
  EXPECT_EQ(layout.recipe, plan.recipe);
  EXPECT_EQ(layout.tp, 2);
  EXPECT_EQ(layout.rank, 1);
  std::vector<std::string> params;
  for (const plan::Buffer& b : plan.buffers) {
    if (b.role == plan::BufferRole::Param && b.alias_of < 0) params.push_back(b.name);
  }
  EXPECT_EQ(asked, params);
  ASSERT_EQ(layout.tensors.size(), params.size());
  int cut = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(layout.tensors[i].name, gpu::ir_name(params[i]));
    EXPECT_EQ(layout.tensors[i].shape,
              (std::vector<std::int64_t>{static_cast<std::int64_t>(i + 1)}));
    EXPECT_TRUE(layout.tensors[i].bytes.empty());
    cut += layout.tensors[i].shard.sharded() ? 1 : 0;
  }
  EXPECT_GE(cut, 3);  // fc1's weight and bias, fc2's weight
  ASSERT_EQ(layout.quantizers.size(), plan.quantizers.size());
  ASSERT_FALSE(layout.quantizers.empty());
  for (std::size_t i = 0; i < plan.quantizers.size(); ++i) {
    EXPECT_EQ(layout.quantizers[i].name, plan.quantizers[i].name);
    EXPECT_EQ(layout.quantizers[i].state.amax_history.size(),
              static_cast<std::size_t>(plan.quantizers[i].spec.history_slots()));
  }
}

// `fusec split-state` on a real program: the one-rank sequence's state cut for the
// tensor-parallel sequence's ranks (checked against their layouts before anything is written),
// merged back by `fusec merge-state` into the same bytes; a sequence that is not tensor-parallel
// and a file without one of the parameters refused, nothing written.
TEST(StateFile, FusecSplitStateCutsAOneRankRunForTheRanksOfATensorParallelSequence) {
  const std::string dir = test::make_temp_dir("split_state_cli");
  const std::string program = dir + "/mlp.fuse";
  {
    std::ofstream out(program);
    out << R"(recipe delayed = delayed_scaling(amax_history = 4)
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses delayed {
  layernorm(64)
  linear(64, 256) as fc1
  swiglu()
  linear(128, 64) as fc2
}
sequence mlp_tp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses delayed with parallel(tp = 2, sp = false) {
  layernorm(64)
  linear(64, 256, parallel = column) as fc1
  swiglu()
  linear(128, 64, parallel = row) as fc2
}
)";
  }
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.sequence = "mlp";
  options.last_stage = driver::Stage::Plan;
  const driver::CompileResult one = driver::compile_file(program, sources, diags, options);
  ASSERT_TRUE(one.ok()) << diags.format_all();
  const plan::SequencePlan& plan = one.plan.sequences.at(0);
  StateFile whole;
  whole.program = "mlp.fuse:mlp";
  whole.recipe = plan.recipe;
  whole.step = 5;
  for (const auto& [name, id] : gpu::caller_tensors(plan)) {
    const plan::Buffer& b = plan.buffers.at(static_cast<std::size_t>(id));
    if (b.role != plan::BufferRole::Param) continue;
    StateTensor t{name, b.dtype, {}, {}, {}};
    std::int64_t n = 1;
    for (const plan::SymExpr& d : b.shape) {
      t.shape.push_back(d.value().value());
      n *= t.shape.back();
    }
    t.bytes.resize(static_cast<std::size_t>(n * plan::dtype_bytes(b.dtype)));
    for (std::size_t i = 0; i < t.bytes.size(); ++i)
      t.bytes[i] = static_cast<unsigned char>((i * 31 + name.size()) % 251);
    whole.tensors.push_back(std::move(t));
  }
  ASSERT_GE(whole.tensors.size(), 4u);  // the norm's two, fc1's and fc2's weights and biases
  for (const plan::QuantizerPlan& q : plan.quantizers) {
    StateQuantizer quantizer{q.name, {}};
    quantizer.state.amax_history.assign(static_cast<std::size_t>(q.spec.history_slots()), 0.25f);
    whole.quantizers.push_back(quantizer);
  }
  write_state_file(dir + "/whole.state", whole);

  const std::string args = "split-state " + test::shell_quoted(dir + "/whole.state") +
                           " --program " + test::shell_quoted(program);
  const test::CommandResult split =
      test::fusec(args + " --sequence mlp_tp -o " + test::shell_quoted(dir + "/ranks"));
  ASSERT_EQ(split.exit_code, 0) << split.output;
  EXPECT_TRUE(test::contains(split.output, "split into 2 ranks' files for 'mlp.fuse:mlp_tp'"))
      << split.output;
  std::size_t cut = 0;
  for (int r = 0; r < 2; ++r) {
    const StateFile f = read_state_file(dir + "/ranks/rank" + std::to_string(r) + ".state");
    EXPECT_EQ(f.rank, r);
    EXPECT_EQ(f.tp, 2);
    EXPECT_EQ(f.program, "mlp.fuse:mlp_tp");
    for (const StateTensor& t : f.tensors) cut += t.shard.sharded() ? 1 : 0;
  }
  EXPECT_GE(cut, 2u * 3u);  // fc1's weight and bias, fc2's weight, on each rank
  const test::CommandResult merged =
      test::fusec("merge-state -o " + test::shell_quoted(dir + "/merged.state") +
                  " --program mlp.fuse:mlp " + test::shell_quoted(dir + "/ranks/rank1.state") +
                  " " + test::shell_quoted(dir + "/ranks/rank0.state"));
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  const StateFile back = read_state_file(dir + "/merged.state");
  ASSERT_EQ(back.tensors.size(), whole.tensors.size());
  for (std::size_t i = 0; i < whole.tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].name, whole.tensors[i].name);
    EXPECT_EQ(back.tensors[i].bytes, whole.tensors[i].bytes) << whole.tensors[i].name;
  }
  EXPECT_EQ(back.step, 5);

  const test::CommandResult plain =
      test::fusec(args + " --sequence mlp -o " + test::shell_quoted(dir + "/plain"));
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_TRUE(test::contains(plain.output, "is not tensor-parallel")) << plain.output;
  StateFile lacking = whole;
  lacking.tensors.pop_back();
  write_state_file(dir + "/lacking.state", lacking);
  const test::CommandResult partial = test::fusec(
      "split-state " + test::shell_quoted(dir + "/lacking.state") + " --program " +
      test::shell_quoted(program) + " --sequence mlp_tp -o " + test::shell_quoted(dir + "/no"));
  EXPECT_EQ(partial.exit_code, 1);
  EXPECT_TRUE(test::contains(partial.output, "lacks parameter")) << partial.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/no"));
  const test::CommandResult which = test::fusec(args + " -o " + test::shell_quoted(dir + "/w"));
  EXPECT_EQ(which.exit_code, 2);
  EXPECT_TRUE(test::contains(which.output, "name one with --sequence: mlp, mlp_tp"))
      << which.output;
}

TEST(StateFile, MismatchesListEveryReason) {
  StateFile file = sample_state();
  file.program = "other.fuse:block";
  file.recipe = "bf16";
  file.tensors[0].shape = {5, 3};
  file.tensors[1].dtype = ir::DType::BF16;
  file.tensors[4].name = "norm.beta";
  file.quantizers[0] = quantizer("fc1.input", 16, 1.0f);
  file.quantizers[1].name = "fc2.weight";
  const std::vector<std::string> expected_reasons = {
      "it was saved from program 'other.fuse:block', this is 'mlp.fuse:mlp'",
      fmt::format("it was saved with recipe 'bf16', this run uses '{}'", kSampleRecipe),
      "tensor 'fc1.weight' has shape [5, 3] in the file, [3, 5] expected",
      "tensor 'fc1.bias' is bf16 in the file, fp32 expected",
      "tensor 'norm.gamma' is missing from the file",
      "the file has a tensor 'norm.beta' that this program lacks",
      "quantizer 'fc1.input' has amax history length 16 in the file, 1 expected",
      "quantizer 'fc1.weight' is missing from the file",
      "the file has a quantizer 'fc2.weight' that this program lacks",
  };
  EXPECT_EQ(state_mismatches(file, expected_layout()), expected_reasons);
  try {
    require_state_fits(file, expected_layout(), "/ckpt/model.state");
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("state file /ckpt/model.state does not fit this program, nothing was "
                           "loaded"),
              std::string::npos)
        << message;
    for (const std::string& reason : expected_reasons) {
      EXPECT_NE(message.find("  - " + reason), std::string::npos) << reason << "\n" << message;
    }
  }
}

TEST(StateFile, MalformedStateIsRefusedBeforeWriting) {
  const std::string dir = test::make_temp_dir("state-malformed");
  StateFile short_bytes = sample_state();
  short_bytes.tensors[0].bytes.pop_back();
  StateFile duplicate = sample_state();
  duplicate.quantizers[1].name = duplicate.quantizers[0].name;
  StateFile empty_history = sample_state();
  empty_history.quantizers[0].state.amax_history.clear();
  const std::vector<std::pair<StateFile, std::string>> cases = {
      {short_bytes, "tensor 'fc1.weight' has 29 bytes, its shape [3, 5] of bf16 needs 30"},
      {duplicate, "two quantizers are named 'fc1.input'"},
      {empty_history, "quantizer 'fc1.input' has an empty amax history"},
  };
  for (const auto& [state, expected] : cases) {
    const std::string path = dir + "/bad.state";
    try {
      write_state_file(path, state);
      ADD_FAILURE() << "expected UsageError: " << expected;
    } catch (const UsageError& error) {
      EXPECT_NE(std::string(error.what())
                    .find(fmt::format("cannot write state file {}: {}; nothing was written", path,
                                      expected)),
                std::string::npos)
          << error.what();
    }
    EXPECT_FALSE(fs::exists(path));
  }
}

TEST(StateFile, ExistingFileIsReplacedWhole) {
  const std::string dir = test::make_temp_dir("state-replace");
  const std::string path = dir + "/model.state";
  StateFile first = sample_state();
  first.step = 1;
  write_state_file(path, first);
  StateFile second = sample_state();
  second.step = 2;
  second.tensors.resize(1);
  write_state_file(path, second);
  const StateFile read = read_state_file(path);
  EXPECT_EQ(read.step, 2);
  EXPECT_EQ(read.tensors.size(), 1u);
  // No temp file is left beside it.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(StateFile, MissingDirectoryIsNotCreated) {
  const std::string dir = test::make_temp_dir("state-nodir") + "/not-yet";
  try {
    write_state_file(dir + "/model.state", sample_state());
    FAIL() << "expected StateFileError";
  } catch (const StateFileError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("cannot write state file " + dir +
                        "/model.state: cannot create a file in " + dir),
              std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(fs::exists(dir));
}

// Writes `replacement` over a valid file at `path` where writing must fail; checks the error and
// that the old file still reads back whole.
void expect_failed_write_keeps_old_file(const std::string& path, const StateFile& replacement) {
  try {
    write_state_file(path, replacement);
    ADD_FAILURE() << "expected StateFileError";
  } catch (const StateFileError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot write state file " + path + ": "),
              std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("the old file there, if any, is unchanged"),
              std::string::npos)
        << error.what();
  }
  const StateFile still = read_state_file(path);
  EXPECT_EQ(still.step, sample_state().step);
  EXPECT_EQ(still.tensors[0].bytes, sample_state().tensors[0].bytes);
  EXPECT_EQ(
      std::distance(fs::directory_iterator(fs::path(path).parent_path()), fs::directory_iterator()),
      1);
}

TEST(StateFile, WriteIntoReadOnlyDirectoryFailsAndKeepsOldFile) {
  if (geteuid() == 0) {
    GTEST_SKIP() << "running as root, which ignores directory permissions; "
                    "FailedWriteKeepsOldFile covers a failing write";
  }
  const std::string path = saved_sample("state-readonly");
  const std::string dir = fs::path(path).parent_path().string();
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  StateFile replacement = sample_state();
  replacement.step = 99;
  expect_failed_write_keeps_old_file(path, replacement);
  ::chmod(dir.c_str(), 0755);
}

TEST(StateFile, FailedWriteKeepsOldFile) {
  // A file-size limit makes the write itself fail (EFBIG), for root too.
  const std::string path = saved_sample("state-efbig");
  StateFile replacement = sample_state();
  replacement.tensors.push_back(tensor("huge", ir::DType::FP32, {1 << 20}, 9));
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 1 << 20;
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // else the process is killed
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  expect_failed_write_keeps_old_file(path, replacement);
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
}

}  // namespace
}  // namespace opfuse::api

namespace opfuse {
namespace {

// Applications catch every runtime failure as opfuse::Error: errors thrown by the real code paths.
TEST(ErrorHierarchy, ReferenceErrorIsAnOpfuseError) {
  cpu::RunOptions options;
  options.steps = 0;
  EXPECT_THROW(cpu::run_reference_training(ir::Sequence{}, options), opfuse::Error);
}

TEST(ErrorHierarchy, JitErrorIsAnOpfuseError) {
  jit::CompileRequest request;
  request.kernel_name = "broken";
  request.source = "__global__ void k(float* x) { x[0] = 1.0f }\n";
  request.name_expressions = {"k"};
  EXPECT_THROW(jit::compile_kernel(request), opfuse::Error);
}

TEST(ErrorHierarchy, StateFileErrorIsAnOpfuseError) {
  EXPECT_THROW(api::read_state_file("/nonexistent/opfuse.state"), opfuse::Error);
}

}  // namespace
}  // namespace opfuse
