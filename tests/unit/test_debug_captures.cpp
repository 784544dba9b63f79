// Tensor captures (compiler/debug_config/captures.h, npy.h): the .npy writer and reader (header,
// values, damaged files refused); captures placed only in routed variants (a config that routes
// nothing compiles to the plain plan); the CPU reference captures the very tensors the API shows;
// DumpTensors' files on a CPU run (only at the iterations it runs, values equal to the tensor
// LogTensorStats measures in the same run); micro-batch file names; an unwritable dump directory
// refused before the first step; a C++ feature's inspect_tensor statistic logged and equal to an
// independent count over the dumped tensor.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cpu/block_quantization.h"
#include "cpu/numerics.h"
#include "debug_config/captures.h"
#include "debug_config/npy.h"
#include "debug_routing_fixture.h"
#include "driver/compile.h"
#include "negative_fraction_feature.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse::debug {
namespace {

namespace fs = std::filesystem;

// ---- .npy ---------------------------------------------------------------------------------------

TEST(Npy, WrittenFilesHaveNumpysHeaderAndReadBack) {
  const std::string dir = test::make_temp_dir("npy");
  NpyArray a;
  a.shape = {3, 4};
  for (int i = 0; i < 12; ++i) a.f32.push_back(float(i) * 0.5f - 2.0f);
  a.f32[5] = -0.0f;
  a.f32[7] = INFINITY;
  write_npy(dir + "/a.npy", a);
  const std::string bytes = test::read_text(dir + "/a.npy");
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(bytes[6], 1);
  EXPECT_EQ(bytes[7], 0);
  const size_t header_len = size_t(uint8_t(bytes[8])) | (size_t(uint8_t(bytes[9])) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 0), 0u)
      << header;
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(bytes.size(), 10 + header_len + 12 * 4);
  const NpyArray b = read_npy(dir + "/a.npy");
  EXPECT_EQ(b.type, NpyType::Float32);
  EXPECT_EQ(b.shape, a.shape);
  ASSERT_EQ(b.f32.size(), 12u);
  for (size_t i = 0; i < 12; ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(b.f32[i]), std::bit_cast<uint32_t>(a.f32[i]));

  NpyArray v;  // one dimension: Python's one-element tuple "(5,)"; uint8
  v.type = NpyType::Uint8;
  v.shape = {5};
  v.u8 = {0, 1, 127, 128, 255};
  write_npy(dir + "/v.npy", v);
  EXPECT_NE(test::read_text(dir + "/v.npy")
                .find("'descr': '|u1', 'fortran_order': False, 'shape': (5,), }"),
            std::string::npos);
  const NpyArray w = read_npy(dir + "/v.npy");
  EXPECT_EQ(w.type, NpyType::Uint8);
  EXPECT_EQ(w.shape, v.shape);
  EXPECT_EQ(w.u8, v.u8);

  NpyArray wrong;  // data that does not match the shape is not written
  wrong.shape = {2, 2};
  wrong.f32 = {1, 2, 3};
  EXPECT_THROW(write_npy(dir + "/wrong.npy", wrong), NpyError);
  EXPECT_FALSE(fs::exists(dir + "/wrong.npy"));
}

TEST(Npy, DamagedFilesAreRefused) {
  NpyArray a;
  a.shape = {2, 3};
  a.f32 = {1, 2, 3, 4, 5, 6};
  const std::string good = npy_bytes(a);
  EXPECT_NO_THROW(parse_npy(good, "good.npy"));
  auto refused = [](const std::string& bytes, const std::string& why) {
    try {
      parse_npy(bytes, "bad.npy");
      ADD_FAILURE() << "accepted a file with " << why;
    } catch (const NpyError& e) {
      EXPECT_NE(std::string(e.what()).find("bad.npy"), std::string::npos) << e.what();
    }
  };
  refused(good.substr(0, good.size() - 1), "a truncated data block");
  refused(good + "x", "a trailing byte");
  refused(good.substr(0, 40), "a truncated header");
  std::string magic = good;
  magic[1] = 'M';
  refused(magic, "a bad magic");
  std::string version = good;
  version[6] = 3;
  refused(version, "version 3.0");
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos);
    s.replace(at, from.size(), to);
    return s;
  };
  refused(replaced("'<f4'", "'<f8'"), "float64 data");
  refused(replaced("False", "True "), "Fortran order");
  refused(replaced("(2, 3)", "(2, 4)"), "a shape larger than the data");
  refused(replaced("(2, 3)", "(2, x)"), "a malformed shape");
  refused(replaced("'shape'", "'shapf'"), "an unknown key");
  EXPECT_THROW(read_npy(test::make_temp_dir("npy_missing") + "/none.npy"), NpyError);
}

// ---- captures in the plan and the reference ---------------------------------------------------

const std::string kLinear = R"(
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 96]) {
  linear(64, 96, bias = false) as fc1
}
)";

const std::string kMlp = R"(
recipe fp8 = delayed_scaling()
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {
  layernorm(64)
  linear(64, 256) as fc1
  swiglu()
  linear(128, 64) as fc2
}
)";

driver::CompileResult compile(const std::string& text, const Routing* routing) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Plan;
  options.debug_routing = routing;
  driver::CompileResult r = driver::compile_source("mlp.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all() << r.error;
  return r;
}

TEST(DebugCaptures, OnlyRoutedIterationsCapture) {
  const auto plain = compile(kMlp, nullptr);
  // DumpTensors at iterations 5.. only: iteration 0 routes nothing and compiles to the plain plan.
  const std::string yaml =
      "a:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, gradient], start_step: 5}\n";
  const auto idle = test::routed(yaml, {"fc1", "fc2"}, true, 0);
  const auto idle_plan = compile(kMlp, &idle->routing);
  EXPECT_EQ(plan::plan_json_text(plain.plan), plan::plan_json_text(idle_plan.plan));
  EXPECT_EQ(plan::plan_json_text(plain.plan).find("capture"), std::string::npos);

  const auto busy = test::routed(yaml, {"fc1", "fc2"}, true, 5);
  const auto v = compile(kMlp, &busy->routing);
  const plan::SequencePlan& p = v.plan.sequences.at(0);
  ASSERT_EQ(p.capture_slots.size(), 4u);
  EXPECT_EQ(p.capture_slots[0].layer, "fc1");
  EXPECT_EQ(p.capture_slots[0].tensor, "activation");
  ASSERT_EQ(p.capture_slots[0].shape.size(), 2u);
  EXPECT_EQ(p.capture_slots[0].shape[1], plan::SymExpr(int64_t(64)));
  int launches = 0;
  for (const plan::Step& s : p.steps) {
    const auto* l = std::get_if<plan::LaunchStep>(&s.body);
    if (l && l->kernel.rfind("tensor_capture", 0) == 0) ++launches;
  }
  EXPECT_EQ(launches, 4);
  // plan.json keeps the slots (with their shapes) and reads them back.
  const std::string text = plan::plan_json_text(v.plan);
  EXPECT_NE(text.find("\"capture_slots\""), std::string::npos);
  EXPECT_EQ(plan::plan_json_text(plan::plan_from_json(plan::plan_to_json(v.plan))), text);
}

TEST(DebugCaptures, ReferenceCapturesAreTheApiTensors) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, weight, output, gradient, dgrad, wgrad]}\n",
      {"fc1"}, false);
  const auto v = compile(kLinear, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  ASSERT_EQ(seq.captures.size(), 6u);
  cpu::ReferenceExecutor<float> exec(seq, {{"tokens", 48}});
  cpu::init_params_from_seed(exec, 7);
  cpu::Tensor<float> x = cpu::seeded_normal({48, 64}, 11, 1.0);
  cpu::round_to_bf16(x.data);
  const auto y = exec.forward({x});
  cpu::Tensor<float> dy = cpu::seeded_normal({48, 96}, 13, 0.1);
  cpu::round_to_bf16(dy.data);
  const auto grads = exec.backward({dy});
  const auto& captures = exec.captures();
  ASSERT_EQ(captures.size(), 6u);
  const cpu::Tensor<float>* tensors[] = {&x,  &exec.param("fc1.weight"), &y[0],
                                         &dy, &grads.inputs[0],          &grads.params[0]};
  const char* names[] = {"activation", "weight", "output", "gradient", "dgrad", "wgrad"};
  for (size_t t = 0; t < 6; ++t) {
    SCOPED_TRACE(names[t]);
    size_t slot = 0;
    while (slot < seq.captures.size() && seq.captures[slot].tensor != names[t]) ++slot;
    ASSERT_LT(slot, seq.captures.size());
    EXPECT_EQ(captures[slot].shape, tensors[t]->shape);
    EXPECT_EQ(captures[slot].values, tensors[t]->data);
  }
}

TEST(DebugCaptures, MicroBatchesGetOneFileEachAndAWeightOnce) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, weight]}\n",
      {"fc1"}, false, 4);
  const std::vector<plan::CaptureSlot> slots = {{"fc1", "activation", {}}, {"fc1", "weight", {}}};
  const CapturedTensor a1{{1, 2}, {1, 2}, {}}, a2{{1, 2}, {3, 4}, {}}, w{{2}, {-1, 1}, {}};
  const std::string dir = test::make_temp_dir("captures_mb");
  IterationCaptures one;
  one.add_run(slots, std::vector<CapturedTensor>{a1, w});
  EXPECT_TRUE(one.finish(r->routing, 4, dir, 0).empty());  // dumps log no statistics
  const fs::path it4 = dump_dir(dir, 0, 4);
  EXPECT_EQ(it4, fs::path(dir) / "tensor_dumps/rank_0/iter_000004");
  EXPECT_EQ(read_npy((it4 / "fc1_activation.npy").string()).f32, a1.values);
  EXPECT_EQ(read_npy((it4 / "fc1_weight.npy").string()).f32, w.values);
  IterationCaptures two;
  two.add_run(slots, std::vector<CapturedTensor>{a1, w});
  two.add_run(slots, std::vector<CapturedTensor>{a2, w});
  (void)two.finish(r->routing, 5, dir, 0);
  const fs::path it5 = dump_dir(dir, 0, 5);
  EXPECT_EQ(read_npy((it5 / "fc1_activation_mb0.npy").string()).f32, a1.values);
  EXPECT_EQ(read_npy((it5 / "fc1_activation_mb1.npy").string()).f32, a2.values);
  EXPECT_EQ(read_npy((it5 / "fc1_activation_mb1.npy").string()).shape, a2.shape);
  EXPECT_TRUE(fs::exists(it5 / "fc1_weight_mb0.npy"));
  EXPECT_FALSE(fs::exists(it5 / "fc1_weight_mb1.npy"));
  EXPECT_FALSE(fs::exists(it5 / "fc1_activation.npy"));
}

TEST(DebugCaptures, Fp8CodesAreTheFormatsNumbers) {
  // Every code of both formats round-trips through its float value; NaN keeps its sign.
  for (const plan::DType format : {plan::DType::E4M3, plan::DType::E5M2}) {
    const cpu::Fp8Format f =
        format == plan::DType::E4M3 ? cpu::Fp8Format::E4M3 : cpu::Fp8Format::E5M2;
    int numbers = 0;
    for (int c = 0; c < 256; ++c) {
      const float v = cpu::fp8_to_float(uint8_t(c), f);
      if (std::isnan(v) || std::isinf(v)) continue;
      ++numbers;
      EXPECT_EQ(fp8_code(v, format), uint8_t(c)) << plan::name(format) << " " << v;
    }
    EXPECT_EQ(numbers, format == plan::DType::E4M3 ? 254 : 248);
    EXPECT_EQ(fp8_code(std::nanf(""), format), uint8_t(0x7F));
    EXPECT_EQ(fp8_code(-std::nanf(""), format), uint8_t(0xFF));
    EXPECT_EQ(fp8_code(0.3f, format), std::nullopt) << "not a number of the format";
  }
  EXPECT_EQ(fp8_code(500.0f, plan::DType::E4M3), std::nullopt);  // beyond 448
  EXPECT_EQ(fp8_code(512.0f, plan::DType::E5M2), uint8_t(0x60));
  EXPECT_EQ(fp8_code(-0.0f, plan::DType::E4M3), uint8_t(0x80));
  EXPECT_EQ(fp8_code(1.0f, plan::DType::BF16), std::nullopt);
}

// DumpTensors' quantized_tensor: the FP8 copy each operand's first GEMM reads (fprop for the
// activation and the weight, dgrad for the gradient), as its codes, its scale_inv and a
// description; C++ features get the same copy beside the high-precision tensor.
TEST(DebugCaptures, QuantizedCopiesAreTheGemmsOperands) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, weight, gradient, output], quantized_tensor: "
      "true, high_precision_tensor: false}\n",
      {"fc1", "fc2"}, true);
  const auto v = compile(kMlp, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  // No high-precision captures; the output has no FP8 copy.
  ASSERT_EQ(seq.captures.size(), 3u);
  for (const plan::CaptureSlot& c : seq.captures) {
    EXPECT_TRUE(c.quantized) << c.tensor;
    // The copy's format is its quantizer's (E5M2 for a gradient under HYBRID).
    const std::string role =
        c.tensor == "activation" ? "input" : (c.tensor == "weight" ? "weight" : "grad_output");
    const auto q =
        std::find_if(seq.quantizers.begin(), seq.quantizers.end(),
                     [&](const ir::QuantizerDecl& d) { return d.name == "fc2." + role; });
    ASSERT_NE(q, seq.quantizers.end()) << role;
    EXPECT_EQ(c.format, q->format()) << c.tensor;
  }
  const plan::SequencePlan& p = v.plan.sequences.at(0);
  EXPECT_EQ(plan::plan_json_text(plan::plan_from_json(plan::plan_to_json(v.plan))),
            plan::plan_json_text(v.plan));
  ASSERT_EQ(p.capture_slots.size(), 3u);
  EXPECT_TRUE(p.capture_slots[0].quantized);

  cpu::ReferenceExecutor<float> exec(seq, {{"tokens", 48}});
  cpu::init_params_from_seed(exec, 7);
  cpu::Tensor<float> x = cpu::seeded_normal({48, 64}, 11, 1.0);
  cpu::round_to_bf16(x.data);
  exec.forward({x});
  cpu::Tensor<float> dy = cpu::seeded_normal({48, 64}, 13, 0.1);
  cpu::round_to_bf16(dy.data);
  exec.backward({dy});
  const auto& captures = exec.captures();
  ASSERT_EQ(captures.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(seq.captures[i].tensor);
    ASSERT_EQ(captures[i].scale_inv.size(), 1u);
    // Step 0 of delayed scaling: scale_inv 1, the codes are the tensor cast as it is.
    EXPECT_EQ(captures[i].scale_inv[0], 1.0f);
    for (const float c : captures[i].values)
      ASSERT_TRUE(fp8_code(c, seq.captures[i].format).has_value()) << c;
  }
  // The weight's copy is fc2's weight cast to E4M3 (saturating, round to nearest even).
  size_t w = 0;
  while (seq.captures[w].tensor != "weight") ++w;
  const std::vector<float>& weight = exec.param("fc2.weight").data;
  ASSERT_EQ(captures[w].values.size(), weight.size());
  for (size_t k = 0; k < weight.size(); ++k) {
    const float want =
        cpu::fp8_to_float(cpu::float_to_fp8(weight[k], cpu::Fp8Format::E4M3), cpu::Fp8Format::E4M3);
    ASSERT_EQ(captures[w].values[k], want) << k;
  }
  EXPECT_EQ(captures[w].shape, (std::vector<int64_t>{64, 128}));

  // The files: codes as uint8 with the tensor's shape, scale_inv as a scalar, the description.
  const std::string dir = test::make_temp_dir("captures_quantized");
  IterationCaptures it;
  it.add_run(seq.captures, captures);
  (void)it.finish(r->routing, 0, dir, 0);
  const fs::path d = dump_dir(dir, 0, 0);
  const NpyArray codes = read_npy((d / "fc2_weight_quantized.npy").string());
  EXPECT_EQ(codes.type, NpyType::Uint8);
  EXPECT_EQ(codes.shape, (std::vector<int64_t>{64, 128}));
  ASSERT_EQ(codes.u8.size(), weight.size());
  for (size_t k = 0; k < weight.size(); ++k)
    ASSERT_EQ(codes.u8[k], cpu::float_to_fp8(weight[k], cpu::Fp8Format::E4M3)) << k;
  const NpyArray inv = read_npy((d / "fc2_weight_quantized_scale_inv.npy").string());
  EXPECT_TRUE(inv.shape.empty());
  EXPECT_EQ(inv.f32, std::vector<float>{1.0f});
  const auto about =
      nlohmann::json::parse(test::read_text((d / "fc2_weight_quantized.json").string()));
  EXPECT_EQ(about["format"], "e4m3");
  EXPECT_EQ(about["data"], "fc2_weight_quantized.npy");
  EXPECT_TRUE(fs::exists(d / "fc2_gradient_quantized.npy"));
  EXPECT_TRUE(fs::exists(d / "fc2_activation_quantized.npy"));
  EXPECT_FALSE(fs::exists(d / "fc2_output_quantized.npy"));
  EXPECT_FALSE(fs::exists(d / "fc2_weight.npy")) << "high_precision_tensor: false";
}

// `exec` (a one-layer linear(160, 96) program bound to `tokens` tokens) gets seeded parameters and
// runs forward and backward (x [tokens, 160] with rows of very different magnitudes, so every
// block row gets its own scale; dy [tokens, 96]); its captures go to IterationCaptures::finish
// with `routing`, writing under `dir`. Returns x as the program read it.
cpu::Tensor<float> run_and_finish_captures(cpu::ReferenceExecutor<float>& exec,
                                           const Routing& routing, int64_t tokens,
                                           const std::string& dir) {
  cpu::init_params_from_seed(exec, 7);
  cpu::Tensor<float> x = cpu::seeded_normal({tokens, 160}, 11, 1.0);
  for (int64_t k = 0; k < x.numel(); ++k) x.data[size_t(k)] *= std::ldexp(1.0f, -int(k / 160 % 9));
  cpu::round_to_bf16(x.data);
  exec.forward({x});
  cpu::Tensor<float> dy = cpu::seeded_normal({tokens, 96}, 13, 0.1);
  cpu::round_to_bf16(dy.data);
  exec.backward({dy});
  IterationCaptures it;
  it.add_run(exec.sequence().captures, exec.captures());
  (void)it.finish(routing, 0, dir, 0);
  return x;
}

// Under float8_block_scaling the quantized dump holds the block copy's codes and its scale grid
// without the layout's padding: [rows, ceil(cols / 128)] for the 1 x 128 blocks of the activation
// and the gradient, [ceil(rows / 128), ceil(cols / 128)] for the weight's 128 x 128 ones.
TEST(DebugCaptures, BlockScaledCopiesAreDumpedWithTheirGrids) {
  const std::string program = R"(
recipe fp8 = float8_block_scaling()
sequence mlp(x: bf16[tokens, 160]) -> (y: bf16[tokens, 96]) uses fp8 {
  linear(160, 96, bias = false) as fc1
}
)";
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, weight, gradient], quantized_tensor: true}\n",
      {"fc1"}, true);
  const auto v = compile(program, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  int quantized = 0, columnwise = 0;
  for (const plan::CaptureSlot& c : seq.captures) {
    if (!c.quantized) continue;
    ++quantized;
    columnwise += c.columnwise;
    EXPECT_EQ(c.block.cols, 128) << c.tensor;
    EXPECT_EQ(c.block.rows, c.tensor == "weight" ? 128 : 1) << c.tensor;
    EXPECT_FALSE(c.columnwise && c.tensor == "weight") << "128 x 128 blocks: one copy's blocks";
  }
  EXPECT_EQ(quantized, 5);
  EXPECT_EQ(columnwise, 2);  // the activation's and the gradient's, quantized down the columns
  EXPECT_EQ(plan::plan_json_text(plan::plan_from_json(plan::plan_to_json(v.plan))),
            plan::plan_json_text(v.plan));

  const int64_t tokens = 200;
  cpu::ReferenceExecutor<float> exec(seq, {{"tokens", tokens}});
  const std::string dir = test::make_temp_dir("captures_block");
  const cpu::Tensor<float> x = run_and_finish_captures(exec, r->routing, tokens, dir);
  const fs::path d = dump_dir(dir, 0, 0);

  // The activation: its 1 x 128 row-wise copy, as the block quantizer makes it from x.
  cpu::BlockQuantParams params;
  const cpu::BlockQuantizedCopy want = cpu::block_quantize_rowwise(x.data, tokens, 160, params);
  const NpyArray codes = read_npy((d / "fc1_activation_quantized.npy").string());
  EXPECT_EQ(codes.shape, (std::vector<int64_t>{tokens, 160}));
  EXPECT_EQ(codes.u8, want.data);
  const NpyArray grid = read_npy((d / "fc1_activation_quantized_scale_inv.npy").string());
  ASSERT_EQ(grid.shape, (std::vector<int64_t>{tokens, 2}));
  std::set<float> distinct;
  for (int64_t row = 0; row < tokens; ++row) {
    for (int64_t cb = 0; cb < 2; ++cb) {
      const float s = grid.f32[size_t(row * 2 + cb)];
      ASSERT_EQ(s, want.scale_inv_at(row, cb * 128, false)) << row << " " << cb;
      int e = 0;
      EXPECT_EQ(std::frexp(s, &e), 0.5f) << "a power of 2";
      distinct.insert(s);
    }
  }
  EXPECT_GT(distinct.size(), 5u);
  const auto about =
      nlohmann::json::parse(test::read_text((d / "fc1_activation_quantized.json").string()));
  EXPECT_EQ(about["scaling"], "block");
  EXPECT_EQ(about["block"], nlohmann::json::array({1, 128}));
  // The weight: one 128 x 128 block row of two block columns.
  cpu::BlockQuantParams two_d;
  two_d.two_d = true;
  const cpu::BlockQuantizedCopy w =
      cpu::block_quantize_rowwise(exec.param("fc1.weight").data, 96, 160, two_d);
  const NpyArray wgrid = read_npy((d / "fc1_weight_quantized_scale_inv.npy").string());
  ASSERT_EQ(wgrid.shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(wgrid.f32[0], w.scale_inv_at(0, 0, true));
  EXPECT_EQ(wgrid.f32[1], w.scale_inv_at(0, 128, true));
  EXPECT_EQ(read_npy((d / "fc1_weight_quantized.npy").string()).u8, w.data);
  EXPECT_EQ(read_npy((d / "fc1_gradient_quantized_scale_inv.npy").string()).shape,
            (std::vector<int64_t>{tokens, 1}));
  // The activation's column-wise copy, as wgrad reads it: x^T [160, 200] in 1 x 128 blocks of
  // its rows (128 x 1 of x), quantized again.
  const cpu::BlockQuantizedCopy col = cpu::block_quantize_columnwise(x.data, tokens, 160, params);
  const NpyArray col_codes = read_npy((d / "fc1_activation_quantized_columnwise.npy").string());
  EXPECT_EQ(col_codes.shape, (std::vector<int64_t>{160, tokens}));
  EXPECT_EQ(col_codes.u8, col.data);
  const NpyArray col_grid =
      read_npy((d / "fc1_activation_quantized_columnwise_scale_inv.npy").string());
  ASSERT_EQ(col_grid.shape, (std::vector<int64_t>{160, 2}));
  for (int64_t row = 0; row < 160; ++row)
    for (int64_t cb = 0; cb < 2; ++cb)
      ASSERT_EQ(col_grid.f32[size_t(row * 2 + cb)], col.scale_inv_at(row, cb * 128, false));
  const auto col_about = nlohmann::json::parse(
      test::read_text((d / "fc1_activation_quantized_columnwise.json").string()));
  EXPECT_EQ(col_about["copy"], "column-wise, stored transposed, as the wgrad GEMM reads it");
  EXPECT_TRUE(fs::exists(d / "fc1_gradient_quantized_columnwise.npy"));
  EXPECT_FALSE(fs::exists(d / "fc1_weight_quantized_columnwise.npy"));
}

// A C++ feature that keeps what inspect_tensor gave it: the quantized copies beside the tensor.
class QuantizedProbe final : public Feature {
 public:
  struct Seen {
    std::vector<int64_t> shape;
    std::vector<float> values;
    struct Copy {
      std::vector<int64_t> shape;
      std::vector<float> values, scale_inv, dequantized;
      plan::DType format = plan::DType::E4M3;
      int block_rows = 0, block_cols = 0;
    } rowwise, columnwise;
  };
  QuantizedProbe() {
    spec_.name = "QuantizedProbe";
    spec_.selects_tensors = true;
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route inspect_tensor_enabled(const CallContext&, TensorKind, int64_t) const override {
    return {true, kNever};
  }
  std::vector<FeatureStat> inspect_tensor(const CallContext&, TensorKind t,
                                          const InspectedTensor& in, int64_t) const override {
    Seen& s = (*seen_)[std::string(plan::name(t))];
    s.shape.assign(in.shape.begin(), in.shape.end());
    s.values.assign(in.values.begin(), in.values.end());
    for (const bool columnwise : {false, true}) {
      const QuantizedView& q = columnwise ? in.columnwise : in.rowwise;
      Seen::Copy& c = columnwise ? s.columnwise : s.rowwise;
      c.shape.assign(q.shape.begin(), q.shape.end());
      c.values.assign(q.values.begin(), q.values.end());
      c.scale_inv.assign(q.scale_inv.begin(), q.scale_inv.end());
      c.format = q.format;
      c.block_rows = q.block_rows;
      c.block_cols = q.block_cols;
      if (q.empty()) continue;
      const int64_t cols = q.shape.back(), rows = int64_t(q.values.size()) / cols;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k) c.dequantized.push_back(q.dequantized(r, k));
    }
    return {};
  }
  std::shared_ptr<std::map<std::string, Seen>> seen_ =
      std::make_shared<std::map<std::string, Seen>>();

 private:
  FeatureSpec spec_;
};

// Under float8_block_scaling a C++ feature's inspect_tensor gets the GEMM operands' FP8 copies as
// the GEMMs read them (TE's rowwise_ and columnwise_quantized_tensor): the activation's and the
// gradient's 1 x 128 row-wise copies and their column-wise copies quantized again down the
// columns (stored transposed), the weight's 128 x 128 copy; each with its scale grid row-major,
// dequantizing to the tensor within the format's rounding. Under delayed scaling: one scale_inv,
// no column-wise copy (the row-wise one transposed).
TEST(DebugCaptures, CppFeaturesGetTheQuantizedCopiesWithTheirScales) {
  auto registry = std::make_shared<FeatureRegistry>(FeatureRegistry::with_builtins());
  auto probe = std::make_shared<QuantizedProbe>();
  registry->add(probe);
  for (const std::string recipe :
       {"float8_block_scaling(format = hybrid)", "delayed_scaling(format = hybrid)"}) {
    SCOPED_TRACE(recipe);
    probe->seen_->clear();
    const bool blocks = recipe.starts_with("float8_block");
    const std::string program = "recipe fp8 = " + recipe + R"(
sequence mlp(x: bf16[tokens, 160]) -> (y: bf16[tokens, 96]) uses fp8 {
  linear(160, 96, bias = false) as fc1
}
)";
    const auto r = test::routed(
        "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
        "    QuantizedProbe: {tensors: [activation, weight, gradient, output]}\n",
        {"fc1"}, true, 0, registry);
    const auto v = compile(program, &r->routing);
    const ir::Sequence& seq = v.program.sequences[0];
    cpu::ReferenceExecutor<float> exec(seq, {{"tokens", 200}});
    (void)run_and_finish_captures(exec, r->routing, 200, test::make_temp_dir("captures_probe"));

    const auto& seen = *probe->seen_;
    ASSERT_EQ(seen.size(), 4u);
    EXPECT_TRUE(seen.at("output").rowwise.values.empty());  // no GEMM reads it: no copy
    for (const std::string tensor : {"activation", "weight", "gradient"}) {
      SCOPED_TRACE(tensor);
      const QuantizedProbe::Seen& s = seen.at(tensor);
      const int64_t rows = s.shape.at(0), cols = s.shape.at(1);
      const bool one_d = blocks && tensor != "weight";
      const plan::DType format = tensor == "gradient" ? plan::DType::E5M2 : plan::DType::E4M3;
      // Half an ULP of the format's mantissa, relative; and half its smallest subnormal.
      const float rel = format == plan::DType::E4M3 ? 0.0625f : 0.125f;
      const float tiny =
          format == plan::DType::E4M3 ? std::ldexp(1.0f, -10) : std::ldexp(1.0f, -17);
      for (const bool columnwise : {false, true}) {
        const QuantizedProbe::Seen::Copy& c = columnwise ? s.columnwise : s.rowwise;
        if (columnwise && !one_d) {
          EXPECT_TRUE(c.values.empty());  // the row-wise copy transposed
          continue;
        }
        SCOPED_TRACE(columnwise ? "column-wise" : "row-wise");
        EXPECT_EQ(c.format, format);
        const std::vector<int64_t> stored =
            columnwise ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
        EXPECT_EQ(c.shape, stored);
        ASSERT_EQ(c.values.size(), s.values.size());
        if (!blocks) {
          EXPECT_EQ(c.block_rows, 0);
          ASSERT_EQ(c.scale_inv.size(), 1u);
        } else {
          EXPECT_EQ(c.block_rows, one_d ? 1 : 128);
          EXPECT_EQ(c.block_cols, 128);
          const int64_t stored_rows = c.shape[0], stored_cols = c.shape[1];
          ASSERT_EQ(int64_t(c.scale_inv.size()),
                    (stored_rows + c.block_rows - 1) / c.block_rows * ((stored_cols + 127) / 128));
        }
        // Every value dequantizes to the tensor's within the format's rounding (the scale_inv of
        // its block applied: a wrong grid layout breaks this for rows of other magnitudes).
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t k = 0; k < cols; ++k) {
            const float want = s.values[size_t(r * cols + k)];
            const size_t at = size_t(columnwise ? k * rows + r : r * cols + k);
            const float got = c.dequantized[at];
            // The scale_inv of its block, at its place in the stored copy.
            const int64_t sr = columnwise ? k : r, sc = columnwise ? r : k;
            const float scale_inv =
                blocks ? c.scale_inv[size_t((sr / c.block_rows) * ((c.shape[1] + 127) / 128) +
                                            sc / 128)]
                       : c.scale_inv[0];
            ASSERT_LE(std::abs(got - want), rel * std::abs(want) + tiny * scale_inv)
                << r << ", " << k;
          }
        }
      }
    }
  }
}

// ---- the CPU run ------------------------------------------------------------------------------

const std::string kBf16Mlp = R"(
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) {
  layernorm(64)
  linear(64, 256) as fc1
  swiglu()
  linear(128, 64) as fc2
}
)";

ir::Sequence front_end(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult r = driver::compile_source("mlp.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all();
  return r.program.sequences.at(0);
}

cpu::RunOptions plain_run() {
  cpu::RunOptions plain;
  plain.bindings = {{"tokens", 16}};
  plain.steps = 4;
  plain.seed = 5;
  return plain;
}

std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(DebugRunCaptures, DumpTensorsWritesTheTensorsAtItsIterations) {
  const ir::Sequence seq = front_end(kBf16Mlp);
  const std::string want = cpu::run_reference_training(seq, plain_run());
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, wgrad], freq: 2, start_step: 1}\n"
      "    LogTensorStats: {tensors: [activation, wgrad], stats: [min, max, l1_norm]}\n",
      {"fc1", "fc2"}, false);
  const std::string dir = test::make_temp_dir("dump_run");
  StatLog log = StatLog::open(dir, 0, 6, [] { return std::string("T"); });
  cpu::RunOptions debugged = plain_run();
  cpu::DebugRunOptions d;
  d.bindings = bind_layers(*r->config, {{"fc1", {}, false}, {"fc2", {}, false}}, *r->diags);
  d.log = &log;
  d.log_dir = dir;
  debugged.debug = d;
  // Dumps change nothing in the training.
  EXPECT_EQ(cpu::run_reference_training(seq, debugged), want);
  // freq 2 from step 1 over iterations 0..3: iterations 2 only (1 and 3 are not multiples of 2).
  const std::vector<std::string> files = files_under(fs::path(dir) / "tensor_dumps");
  EXPECT_EQ(files, (std::vector<std::string>{"rank_0/iter_000002/fc2_activation.npy",
                                             "rank_0/iter_000002/fc2_wgrad.npy"}));
  // The values are the tensors LogTensorStats measured in the same run (its own kernel).
  std::map<std::string, double> logged;
  for (const StatRecord& rec : read_stat_jsonl(dir + "/opfuse_statistics/globalrank-0.jsonl"))
    if (rec.iteration == 2) logged[metric_name(rec)] = rec.value;
  const fs::path it2 = dump_dir(dir, 0, 2);
  const NpyArray act = read_npy((it2 / "fc2_activation.npy").string());
  EXPECT_EQ(act.shape, (std::vector<int64_t>{16, 128}));
  const NpyArray wgrad = read_npy((it2 / "fc2_wgrad.npy").string());
  EXPECT_EQ(wgrad.shape, (std::vector<int64_t>{64, 128}));
  for (const auto& [name, array] : {std::pair{"fc2_activation", &act}, {"fc2_wgrad", &wgrad}}) {
    double mn = INFINITY, mx = -INFINITY, l1 = 0;
    for (float v : array->f32) {
      mn = std::min(mn, double(v));
      mx = std::max(mx, double(v));
      l1 += std::abs(double(v));
    }
    EXPECT_EQ(mn, logged.at(std::string(name) + "_min")) << name;
    EXPECT_EQ(mx, logged.at(std::string(name) + "_max")) << name;
    EXPECT_NEAR(l1, logged.at(std::string(name) + "_l1_norm"), 1e-9 * l1) << name;
    EXPECT_GT(mx, mn);
  }
}

TEST(DebugRunCaptures, UnwritableDumpDirectoryIsRefusedBeforeTheFirstStep) {
  const ir::Sequence seq = front_end(kBf16Mlp);
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation], start_step: 100}\n",
      {"fc1", "fc2"}, false);
  const std::string dir = test::make_temp_dir("dump_unwritable");
  std::ofstream(dir + "/tensor_dumps") << "a file where the directory should be";
  StatLog log = StatLog::open(dir + "/logs", 0, 4, [] { return std::string("T"); });
  cpu::RunOptions debugged = plain_run();
  cpu::DebugRunOptions d;
  d.bindings = bind_layers(*r->config, {{"fc1", {}, false}, {"fc2", {}, false}}, *r->diags);
  d.log = &log;
  d.log_dir = dir;
  debugged.debug = d;
  try {
    cpu::run_reference_training(seq, debugged);
    ADD_FAILURE() << "ran with an unwritable dump directory";
  } catch (const cpu::ReferenceError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write tensor dumps to '" + dir + "/tensor_dumps"),
              std::string::npos)
        << e.what();
  }
  // Refused before any step: nothing was logged (the dumps would start only at step 100).
  log.end_step();
  EXPECT_EQ(test::read_text(dir + "/logs/nvdlfw_inspect_logs/nvdlfw_inspect_globalrank-0.log"), "");
}

TEST(DebugRunCaptures, CppFeatureInspectTensorIsLoggedLikeABuiltIn) {
  const ir::Sequence seq = front_end(kBf16Mlp);
  const auto custom = test::read_custom_config(
      "a:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    NegativeFraction: {tensors: [output, gradient], end_step: 1}\n"
      "    DumpTensors: {tensors: [output, gradient], end_step: 1}\n",
      {"fc1", "fc2"}, false);
  ASSERT_TRUE(custom->config);
  const std::string dir = test::make_temp_dir("custom_feature");
  {
    StatLog log = StatLog::open(dir, 0, 4, [] { return std::string("T"); });
    cpu::RunOptions debugged = plain_run();
    cpu::DebugRunOptions d;
    d.bindings = custom->bindings;
    d.log = &log;
    d.log_dir = dir;
    debugged.debug = d;
    EXPECT_EQ(cpu::run_reference_training(seq, debugged),
              cpu::run_reference_training(seq, plain_run()));
  }
  const auto records = read_stat_jsonl(dir + "/opfuse_statistics/globalrank-0.jsonl");
  // Iterations 0 and 1, two layers, two tensors.
  ASSERT_EQ(records.size(), 2u * 2 * 2);
  for (const StatRecord& rec : records) {
    SCOPED_TRACE(metric_name(rec));
    EXPECT_EQ(rec.stat, "negative_fraction");
    EXPECT_EQ(rec.gemm, "");
    // Independently: count the negatives of the tensor DumpTensors wrote.
    const NpyArray t = read_npy(
        (dump_dir(dir, 0, rec.iteration) / (rec.layer + "_" + rec.tensor + ".npy")).string());
    ASSERT_FALSE(t.f32.empty());
    size_t negative = 0;
    for (float v : t.f32) negative += v < 0 ? 1 : 0;
    EXPECT_EQ(rec.value, double(negative) / double(t.f32.size()));
    EXPECT_GT(rec.value, 0.0);
    EXPECT_LT(rec.value, 1.0);
  }
  const std::string text =
      test::read_text(dir + "/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log");
  EXPECT_NE(text.find("T - INFO - fc1_output_negative_fraction \t\t\t\t iteration=000001 \t\t\t\t "
                      "value=0."),
            std::string::npos)
      << text;
}

// ---- fusec run ---------------------------------------------------------------------------------

std::string write_config(const std::string& dir, const std::string& yaml) {
  const std::string path = dir + "/debug.yaml";
  std::ofstream(path) << yaml;
  return path;
}

TEST(FusecRunDumps, WritesTheDumpsUnderTheLogDirectory) {
  const std::string dir = test::make_temp_dir("fusec_dumps");
  const std::string config =
      write_config(dir,
                   "d:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
                   "    DumpTensors: {tensors: [activation, dgrad], freq: 2}\n");
  const auto r = test::fusec(
      "run " + test::shell_quoted(test::source_path("tests/errors/debug_config/program.fuse")) +
      " --device cpu --bind tokens=16 --steps 3 --debug-config " + test::shell_quoted(config) +
      " --debug-log-dir " + test::shell_quoted(dir + "/logs"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_under(dir + "/logs/tensor_dumps"),
            (std::vector<std::string>{
                "rank_0/iter_000000/fc1_activation.npy", "rank_0/iter_000000/fc1_dgrad.npy",
                "rank_0/iter_000002/fc1_activation.npy", "rank_0/iter_000002/fc1_dgrad.npy"}));
  const NpyArray a = read_npy(dir + "/logs/tensor_dumps/rank_0/iter_000002/fc1_activation.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{16, 64}));
  // The dry run lists the captures of the variant.
  const auto plan =
      test::fusec("debug-plan " +
                  test::shell_quoted(test::source_path("tests/errors/debug_config/program.fuse")) +
                  " --debug-config " + test::shell_quoted(config));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("    capture: fc1 activation\n    capture: fc1 dgrad\n"),
            std::string::npos)
      << plan.output;
}

// quantized_tensor through `fusec run --device cpu`: the FP8 copies beside the tensors, and the
// dry run says which copy each capture is.
TEST(FusecRunDumps, QuantizedCopiesAreWrittenBesideTheTensors) {
  const std::string dir = test::make_temp_dir("fusec_dumps_quantized");
  const std::string config =
      write_config(dir,
                   "d:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
                   "    DumpTensors: {tensors: [activation, gradient], quantized_tensor: true}\n");
  const std::string program =
      test::shell_quoted(test::source_path("tests/errors/debug_config/program.fuse"));
  const auto r = test::fusec("run " + program + " --device cpu --bind tokens=16 --steps 1 " +
                             "--debug-config " + test::shell_quoted(config) + " --debug-log-dir " +
                             test::shell_quoted(dir + "/logs"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string it0 = dir + "/logs/tensor_dumps/rank_0/iter_000000/";
  EXPECT_EQ(files_under(it0),
            (std::vector<std::string>{"fc2_activation.npy", "fc2_activation_quantized.json",
                                      "fc2_activation_quantized.npy",
                                      "fc2_activation_quantized_scale_inv.npy", "fc2_gradient.npy",
                                      "fc2_gradient_quantized.json", "fc2_gradient_quantized.npy",
                                      "fc2_gradient_quantized_scale_inv.npy"}));
  // fc2's input is GELU's output: its codes are that tensor cast with scale 1 (step 0).
  const NpyArray hp = read_npy(it0 + "fc2_activation.npy");
  const NpyArray codes = read_npy(it0 + "fc2_activation_quantized.npy");
  EXPECT_EQ(codes.shape, hp.shape);
  ASSERT_EQ(codes.u8.size(), hp.f32.size());
  for (size_t k = 0; k < hp.f32.size(); ++k)
    ASSERT_EQ(codes.u8[k], cpu::float_to_fp8(hp.f32[k], cpu::Fp8Format::E4M3)) << k;
  EXPECT_EQ(read_npy(it0 + "fc2_activation_quantized_scale_inv.npy").f32, std::vector<float>{1.0f});
  const auto about = nlohmann::json::parse(test::read_text(it0 + "fc2_gradient_quantized.json"));
  EXPECT_EQ(about["copy"], "row-wise, as the dgrad GEMM reads it");

  const auto plan =
      test::fusec("debug-plan " + program + " --debug-config " + test::shell_quoted(config));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(
      plan.output.find(
          "    capture: fc2 activation (FP8 copy as fprop reads it, e4m3, and its scale_inv)"),
      std::string::npos)
      << plan.output;
}

TEST(FusecRunDumps, UnwritableDumpDirectoryIsReportedBeforeTheFirstStep) {
  const std::string dir = test::make_temp_dir("fusec_dumps_bad");
  const std::string config =
      write_config(dir,
                   "d:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
                   "    DumpTensors: {tensors: [activation]}\n");
  fs::create_directories(dir + "/logs");
  std::ofstream(dir + "/logs/tensor_dumps") << "a file where the directory should be";
  const auto r = test::fusec(
      "run " + test::shell_quoted(test::source_path("tests/errors/debug_config/program.fuse")) +
      " --device cpu --bind tokens=16 --debug-config " + test::shell_quoted(config) +
      " --debug-log-dir " + test::shell_quoted(dir + "/logs"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot write tensor dumps to"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step    0"), std::string::npos) << r.output;  // nothing ran
}

}  // namespace
}  // namespace opfuse::debug
