// Note "Pipelined collectives" (runtime/gpu/executor_run.cpp): the GEMM / collective pairs a
// tensor-parallel plan offers (gpu/collective_overlap.h), and that every schedule of row pieces
// and stages computes what the unpipelined pair does, with the collectives simulated over ranks.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "gpu/collective_overlap.h"
#include "test_support.h"

namespace opfuse {
namespace {

using gpu::GemmPiece;
using gpu::OverlapKind;
using gpu::OverlapPair;
using gpu::OverlapSchedule;
using plan::CollectiveKind;

constexpr const char* kMlp = R"(
recipe delayed = delayed_scaling(format = hybrid)
recipe blocks = float8_block_scaling()
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses delayed with parallel(tp = 2, sp = false) {
  layernorm(64, eps = 1e-5)
  linear(64, 256, bias = false, parallel = column) as fc1
  swiglu()
  linear(128, 64, bias = false, parallel = row) as fc2
}
sequence mlp_sp(x: bf16[tokens / tp, 64]) -> (y: bf16[tokens / tp, 64]) uses delayed with parallel(tp = 2, sp = true) {
  layernorm(64, eps = 1e-5)
  linear(64, 256, bias = false, parallel = column) as fc1
  swiglu()
  linear(128, 64, bias = false, parallel = row) as fc2
}
sequence one(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses delayed {
  layernorm(64, eps = 1e-5)
  linear(64, 256, bias = false) as fc1
  swiglu()
  linear(128, 64, bias = false) as fc2
}
)";

plan::SequencePlan planned(const std::string& sequence, const std::string& recipe) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.recipe = recipe;
  options.sequence = sequence;
  options.last_stage = driver::Stage::Plan;
  driver::CompileResult r = driver::compile_source("mlp.fuse", kMlp, sources, diags, options);
  if (!r.ok()) throw std::runtime_error(diags.format_all() + r.error);
  for (const plan::SequencePlan& s : r.plan.sequences)
    if (s.name == sequence) return s;
  throw std::runtime_error("no sequence " + sequence);
}

// "fprop GEMM of fc2", "sum over the 2 ranks ..." : the step's one-line description.
std::string what(const plan::SequencePlan& s, int step) {
  return s.steps.at(static_cast<std::size_t>(step)).what;
}

std::vector<std::string> described(const plan::SequencePlan& s,
                                   const std::vector<OverlapPair>& pairs) {
  std::vector<std::string> out;
  for (const OverlapPair& p : pairs) {
    const std::string kind = p.kind == OverlapKind::GemmThenReduce ? "then " : "before ";
    out.push_back(what(s, p.gemm) + " | " + kind + what(s, p.collective));
  }
  return out;
}

// fc2's fprop with the all-reduce ending the forward; not fc1's dgrad with its reduction, which
// fc1's wgrad GEMM (the next step, independent of it) already hides.
TEST(CollectiveOverlap, TensorParallelMlpPairsFc2WithTheForwardsAllReduceOnly) {
  for (const std::string recipe : {"bf16", "delayed"}) {
    SCOPED_TRACE(recipe);
    const plan::SequencePlan s = planned("mlp", recipe);
    const std::vector<OverlapPair> pairs = gpu::find_overlap_pairs(s);
    ASSERT_EQ(pairs.size(), 1u) << testing::PrintToString(described(s, pairs));
    EXPECT_EQ(pairs[0].kind, OverlapKind::GemmThenReduce);
    EXPECT_EQ(pairs[0].collective, pairs[0].gemm + 1);
    EXPECT_EQ(pairs[0].head(), pairs[0].gemm);
    EXPECT_NE(what(s, pairs[0].gemm).find("fprop GEMM of fc2"), std::string::npos);
    EXPECT_EQ(s.steps[static_cast<std::size_t>(pairs[0].gemm)].phase, plan::Phase::Forward);
    const auto& c =
        std::get<plan::CollectiveStep>(s.steps[static_cast<std::size_t>(pairs[0].collective)].body);
    EXPECT_EQ(c.kind, CollectiveKind::AllReduce);
    // fc1's dgrad and its all-reduce are adjacent too, and the wgrad GEMM after them reads
    // neither the reduction's output nor its input.
    bool dgrad_then_reduce = false;
    for (std::size_t i = 0; i + 2 < s.steps.size(); ++i) {
      if (s.steps[i].what.find("dgrad GEMM of fc1") == std::string::npos) continue;
      dgrad_then_reduce = std::holds_alternative<plan::CollectiveStep>(s.steps[i + 1].body);
      EXPECT_NE(s.steps[i + 2].what.find("wgrad GEMM of fc1"), std::string::npos);
    }
    EXPECT_TRUE(dgrad_then_reduce);
  }
}

// Both gathers (fc1's input in the forward, fc2's output gradient in the backward) before the
// GEMMs that read them, and the reduce-scatter ending the forward.
TEST(CollectiveOverlap, SequenceParallelMlpPairsBothGathersAndTheForwardsReduceScatter) {
  const plan::SequencePlan s = planned("mlp_sp", "bf16");
  const std::vector<OverlapPair> pairs = gpu::find_overlap_pairs(s);
  ASSERT_EQ(pairs.size(), 3u) << testing::PrintToString(described(s, pairs));
  const OverlapKind kinds[] = {OverlapKind::GatherThenGemm, OverlapKind::GemmThenReduce,
                               OverlapKind::GatherThenGemm};
  const char* gemms[] = {"fprop GEMM of fc1", "fprop GEMM of fc2", "dgrad GEMM of fc2"};
  for (std::size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(pairs[i].kind, kinds[i]);
    EXPECT_NE(what(s, pairs[i].gemm).find(gemms[i]), std::string::npos) << what(s, pairs[i].gemm);
    const auto& c =
        std::get<plan::CollectiveStep>(s.steps[static_cast<std::size_t>(pairs[i].collective)].body);
    EXPECT_EQ(c.kind, kinds[i] == OverlapKind::GatherThenGemm ? CollectiveKind::AllGather
                                                              : CollectiveKind::ReduceScatter);
    // Adjacent, the head first.
    EXPECT_EQ(pairs[i].head() + 1,
              kinds[i] == OverlapKind::GatherThenGemm ? pairs[i].gemm : pairs[i].collective);
  }
}

// Under delayed scaling the gathers move E4M3 / E5M2 codes (pass gather-fp8) and the transposed
// copy of the gathered codes comes between the gather and its GEMM: only the forward's
// reduce-scatter pipelines.
TEST(CollectiveOverlap, SequenceParallelFp8PairsTheForwardsReduceScatterOnly) {
  const plan::SequencePlan s = planned("mlp_sp", "delayed");
  const std::vector<OverlapPair> pairs = gpu::find_overlap_pairs(s);
  ASSERT_EQ(pairs.size(), 1u) << testing::PrintToString(described(s, pairs));
  EXPECT_NE(what(s, pairs[0].gemm).find("fprop GEMM of fc2"), std::string::npos);
  EXPECT_EQ(pairs[0].kind, OverlapKind::GemmThenReduce);
  bool fp8_gather = false;
  for (const plan::Step& step : s.steps) {
    const auto* c = std::get_if<plan::CollectiveStep>(&step.body);
    fp8_gather |=
        c != nullptr && c->kind == CollectiveKind::AllGather && plan::dtype_is_fp8(c->dtype);
  }
  EXPECT_TRUE(fp8_gather);
}

TEST(CollectiveOverlap, NothingPipelinesWithoutRanksOrWithBlockScaleGrids) {
  EXPECT_TRUE(gpu::find_overlap_pairs(planned("one", "delayed")).empty());
  // float8_block_scaling: the GEMMs read 1 x 128 / 128 x 128 scale grids (a piece would need its
  // rows of them) and the gathers are bf16, cast after.
  EXPECT_TRUE(gpu::find_overlap_pairs(planned("mlp", "blocks")).empty());
  EXPECT_TRUE(gpu::find_overlap_pairs(planned("mlp_sp", "blocks")).empty());
}

TEST(CollectiveOverlap, PairsNeedTheReductionToBeDsOnlyReaderAndAPlainGemm) {
  const plan::SequencePlan s = planned("mlp", "bf16");
  const OverlapPair fc2 = gpu::find_overlap_pairs(s).at(0);
  const auto g = static_cast<std::size_t>(fc2.gemm);
  const int d = std::get<plan::GemmStep>(s.steps[g].body).d;
  {  // a later step reading D (the pieces lay it out in the collective's order)
    plan::SequencePlan read = s;
    read.steps.back().reads.push_back(d);
    EXPECT_TRUE(gpu::find_overlap_pairs(read).empty());
  }
  {  // the caller reads D back
    plan::SequencePlan shown = s;
    shown.buffers[static_cast<std::size_t>(d)].interface.push_back({});
    EXPECT_TRUE(gpu::find_overlap_pairs(shown).empty());
  }
  {  // a step after the reduction that does not read its output: it would overlap it unpipelined
    plan::SequencePlan more = s;
    plan::Step independent = more.steps.front();  // the layernorm: touches neither D nor y
    independent.index = fc2.collective + 1;
    more.steps.insert(more.steps.begin() + fc2.collective + 1, independent);
    for (std::size_t i = static_cast<std::size_t>(fc2.collective) + 2; i < more.steps.size(); ++i)
      more.steps[i].index = static_cast<int>(i);
    EXPECT_TRUE(gpu::find_overlap_pairs(more).empty());
    // ... unless it reads the output.
    const int out =
        std::get<plan::CollectiveStep>(s.steps[static_cast<std::size_t>(fc2.collective)].body)
            .output;
    more.steps[static_cast<std::size_t>(fc2.collective) + 1].reads.push_back(out);
    EXPECT_EQ(gpu::find_overlap_pairs(more).size(), 1u);
  }
  const auto without_fc2 = [&](auto change) {
    plan::SequencePlan changed = s;
    change(std::get<plan::GemmStep>(changed.steps[g].body));
    const std::vector<OverlapPair> pairs = gpu::find_overlap_pairs(changed);
    return pairs.empty() || pairs[0].gemm != fc2.gemm;
  };
  EXPECT_TRUE(without_fc2([](plan::GemmStep& gemm) { gemm.a_transposed = true; }));
  EXPECT_TRUE(without_fc2([](plan::GemmStep& gemm) { gemm.accumulate = true; }));
  EXPECT_TRUE(without_fc2([](plan::GemmStep& gemm) { gemm.d_quantizer = 0; }));
  EXPECT_TRUE(without_fc2([](plan::GemmStep& gemm) { gemm.a.scale_inv.buffer = 0; }));
  EXPECT_TRUE(
      without_fc2([](plan::GemmStep& gemm) { gemm.epilogue = plan::GemmEpilogue::GeluAuxBias; }));
  EXPECT_FALSE(without_fc2([](plan::GemmStep& gemm) { gemm.epilogue = plan::GemmEpilogue::Bias; }));
}

// What `fusec bench --nproc` prints as its "collectives:" notes.
TEST(CollectiveOverlap, ReportsSayWhatRunsBesideWhat) {
  const plan::SequencePlan s = planned("mlp_sp", "bf16");
  const std::vector<OverlapPair> pairs = gpu::find_overlap_pairs(s);
  const std::vector<std::string> lines = gpu::describe_overlap(s, pairs, 2, 16, 132);
  ASSERT_EQ(lines.size(), 4u) << testing::PrintToString(lines);
  EXPECT_EQ(lines[0],
            "a GEMM beside a collective in flight leaves it 16 of the 132 SMs "
            "(OPFUSE_COLLECTIVE_SMS)");
  EXPECT_EQ(lines[1],
            fmt::format("steps {} and {} pipelined: {} beside {} (this rank's rows first)",
                        pairs[0].collective, pairs[0].gemm, what(s, pairs[0].collective),
                        what(s, pairs[0].gemm)));
  EXPECT_TRUE(test::contains(lines[2],
                             "pipelined in 2 stages (OPFUSE_COLLECTIVE_CHUNKS): fprop "
                             "GEMM of fc2"))
      << lines[2];
  const std::vector<std::string> off = gpu::describe_overlap(s, {}, 1, 0, 132);
  EXPECT_EQ(off, (std::vector<std::string>{
                     "a GEMM beside a collective in flight takes every SM "
                     "(OPFUSE_COLLECTIVE_SMS=0)",
                     "no GEMM pipelined with a collective (OPFUSE_COLLECTIVE_CHUNKS=1)"}));
  EXPECT_EQ(gpu::describe_overlap(planned("mlp", "blocks"), {}, 2, 16, 132).back(),
            "no GEMM pipelined with a collective (none qualifies)");
}

TEST(CollectiveOverlap, RowGranuleKeepsEveryPiece256ByteAligned) {
  EXPECT_EQ(gpu::overlap_row_granule(8192, 8192), 1);  // bf16 rows of 4096
  EXPECT_EQ(gpu::overlap_row_granule(64, 128), 4);     // e4m3 rows of 64, bf16 rows of 64
  EXPECT_EQ(gpu::overlap_row_granule(96, 64), 8);
  EXPECT_EQ(gpu::overlap_row_granule(7, 2), 256);
  for (const std::int64_t a : {2, 48, 96, 4096, 7168}) {
    for (const std::int64_t d : {2, 128, 8192}) {
      const std::int64_t g = gpu::overlap_row_granule(a, d);
      EXPECT_EQ(g * a % 256, 0);
      EXPECT_EQ(g * d % 256, 0);
    }
  }
}

// Rank r's GEMM result row i (the partial sums the reduction adds): distinct per rank and row.
double partial(int rank, std::int64_t row) { return static_cast<double>(rank * 100000 + row); }

// Runs `schedule` on every rank (the GEMM piece copies partial() rows into D, the stage's
// collective is computed exactly) and returns each rank's collective output.
std::vector<std::vector<double>> run_reduce(CollectiveKind kind, const OverlapSchedule& schedule,
                                            std::int64_t m, int tp) {
  std::vector<std::vector<double>> d(static_cast<std::size_t>(tp), std::vector<double>(m, -1));
  std::vector<std::vector<int>> written(static_cast<std::size_t>(tp), std::vector<int>(m, 0));
  const std::int64_t out_rows = kind == CollectiveKind::AllReduce ? m : m / tp;
  std::vector<std::vector<double>> out(static_cast<std::size_t>(tp),
                                       std::vector<double>(out_rows, -1));
  for (const gpu::OverlapStage& stage : schedule.stages) {
    for (int r = 0; r < tp; ++r) {
      for (const GemmPiece& piece : stage.pieces) {
        EXPECT_FALSE(piece.local);
        for (std::int64_t i = 0; i < piece.rows; ++i) {
          d[r][piece.d_row + i] = partial(r, piece.a_row + i);
          ++written[r][piece.d_row + i];
        }
      }
    }
    // The stage reads only rows its pieces (or earlier ones) wrote.
    for (std::int64_t i = 0; i < stage.in_rows; ++i) EXPECT_EQ(written[0][stage.in_row + i], 1);
    if (kind == CollectiveKind::AllReduce) {
      for (int r = 0; r < tp; ++r) {
        for (std::int64_t i = 0; i < stage.in_rows; ++i) {
          double sum = 0;
          for (int q = 0; q < tp; ++q) sum += d[q][stage.in_row + i];
          out[r][stage.out_row + i] = sum;
        }
      }
    } else {  // NCCL's reduce-scatter: rank r gets the r-th of tp equal parts of the stage's rows
      EXPECT_EQ(stage.in_rows % tp, 0);
      const std::int64_t part = stage.in_rows / tp;
      for (int r = 0; r < tp; ++r) {
        for (std::int64_t i = 0; i < part; ++i) {
          double sum = 0;
          for (int q = 0; q < tp; ++q) sum += d[q][stage.in_row + r * part + i];
          out[r][stage.out_row + i] = sum;
        }
      }
    }
  }
  for (int r = 0; r < tp; ++r)
    for (std::int64_t i = 0; i < m; ++i) EXPECT_EQ(written[r][i], 1) << "row " << i;
  return out;
}

TEST(CollectiveOverlap, ReduceSchedulesComputeTheUnpipelinedReduction) {
  for (const CollectiveKind kind : {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter}) {
    for (const int tp : {2, 4, 8}) {
      for (const int chunks : {2, 3, 4, 8}) {
        for (const std::int64_t granule : {1, 4}) {
          const std::int64_t m = 8 * 24;  // shares of 96, 48, 24 rows
          SCOPED_TRACE(testing::Message() << "kind " << static_cast<int>(kind) << " tp " << tp
                                          << " chunks " << chunks << " granule " << granule);
          const OverlapSchedule schedule = gpu::reduce_schedule(kind, m, tp, chunks, granule);
          ASSERT_GE(schedule.stages.size(), 2u);
          ASSERT_LE(schedule.stages.size(), static_cast<std::size_t>(chunks));
          for (const gpu::OverlapStage& stage : schedule.stages) {
            EXPECT_EQ(stage.pieces.size(),
                      kind == CollectiveKind::AllReduce ? 1u : std::size_t(tp));
            for (const GemmPiece& piece : stage.pieces) {
              EXPECT_EQ(piece.rows % granule, 0);
              EXPECT_EQ(piece.a_row % granule, 0);
              EXPECT_EQ(piece.d_row % granule, 0);
            }
          }
          const std::vector<std::vector<double>> out = run_reduce(kind, schedule, m, tp);
          for (int r = 0; r < tp; ++r) {
            const std::int64_t rows = kind == CollectiveKind::AllReduce ? m : m / tp;
            const std::int64_t first = kind == CollectiveKind::AllReduce ? 0 : r * (m / tp);
            for (std::int64_t i = 0; i < rows; ++i) {
              double sum = 0;
              for (int q = 0; q < tp; ++q) sum += partial(q, first + i);
              ASSERT_EQ(out[r][i], sum) << "rank " << r << " row " << i;
            }
          }
        }
      }
    }
  }
}

TEST(CollectiveOverlap, ReduceSchedulesRefuseWhatDoesNotSplit) {
  EXPECT_TRUE(gpu::reduce_schedule(CollectiveKind::AllReduce, 64, 2, 1, 1).stages.empty());
  EXPECT_TRUE(gpu::reduce_schedule(CollectiveKind::AllReduce, 4, 2, 4, 4).stages.empty());
  EXPECT_TRUE(gpu::reduce_schedule(CollectiveKind::AllReduce, 6, 2, 4, 4).stages.empty());
  EXPECT_TRUE(gpu::reduce_schedule(CollectiveKind::ReduceScatter, 8, 2, 4, 4).stages.empty());
  EXPECT_TRUE(gpu::reduce_schedule(CollectiveKind::ReduceScatter, 9, 2, 4, 1).stages.empty());
  EXPECT_TRUE(gpu::reduce_schedule(CollectiveKind::AllGather, 64, 2, 4, 1).stages.empty());
  // Fewer granules than chunks: as many stages as granules; the last takes the remainder.
  const OverlapSchedule three = gpu::reduce_schedule(CollectiveKind::AllReduce, 12, 2, 8, 4);
  EXPECT_EQ(three.stages.size(), 3u);
  const OverlapSchedule uneven = gpu::reduce_schedule(CollectiveKind::AllReduce, 20, 2, 3, 4);
  ASSERT_EQ(uneven.stages.size(), 3u);
  EXPECT_EQ(uneven.stages[0].in_rows, 4);
  EXPECT_EQ(uneven.stages[2].in_rows, 12);
}

TEST(CollectiveOverlap, GatherSchedulesComputeEveryRowOnceTheirOwnShareFirst) {
  for (const int tp : {2, 3, 4, 8}) {
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE(testing::Message() << "tp " << tp << " rank " << rank);
      const std::int64_t share = 16, m = share * tp;
      const OverlapSchedule schedule = gpu::gather_schedule(m, tp, rank, 128, 512);
      ASSERT_EQ(schedule.stages.size(), 2u);
      ASSERT_EQ(schedule.stages[0].pieces.size(), 1u);
      const GemmPiece& mine = schedule.stages[0].pieces[0];
      EXPECT_EQ(mine, (GemmPiece{0, rank * share, share, true}));
      // D's rows from A's: the local piece reads this rank's share (gathered row rank * share + i).
      std::vector<std::int64_t> d(static_cast<std::size_t>(m), -1);
      for (std::int64_t i = 0; i < mine.rows; ++i)
        d[mine.d_row + i] = rank * share + mine.a_row + i;
      for (const GemmPiece& piece : schedule.stages[1].pieces) {
        EXPECT_FALSE(piece.local);
        EXPECT_EQ(piece.a_row, piece.d_row);
        for (std::int64_t i = 0; i < piece.rows; ++i) {
          EXPECT_EQ(d[piece.d_row + i], -1);
          d[piece.d_row + i] = piece.a_row + i;
        }
      }
      std::vector<std::int64_t> rows(static_cast<std::size_t>(m));
      std::iota(rows.begin(), rows.end(), 0);
      EXPECT_EQ(d, rows);
      EXPECT_EQ(schedule.stages[1].pieces.size(),
                static_cast<std::size_t>((rank > 0 ? 1 : 0) + (rank + 1 < tp ? 1 : 0)));
    }
  }
  EXPECT_TRUE(gpu::gather_schedule(32, 1, 0, 128, 128).stages.empty());
  EXPECT_TRUE(gpu::gather_schedule(33, 2, 0, 128, 128).stages.empty());
  EXPECT_TRUE(gpu::gather_schedule(6, 2, 0, 2, 128).stages.empty());  // 3 rows of 2 bytes
  EXPECT_TRUE(gpu::gather_schedule(32, 2, 2, 128, 128).stages.empty());
}

TEST(CollectiveOverlap, MemoryTheStagesWouldRaceOnIsRefused) {
  using R = gpu::AddressRange;
  const R a{1000, 2000}, b{2000, 3000}, d{3000, 4000}, in{3000, 4000};
  EXPECT_EQ(gpu::overlap_memory_refusal(OverlapKind::GemmThenReduce, {a, b}, d, in, R{5000, 6000}),
            "");
  EXPECT_NE(gpu::overlap_memory_refusal(OverlapKind::GemmThenReduce, {a, b}, d, in, R{1500, 1600}),
            "");
  EXPECT_NE(gpu::overlap_memory_refusal(OverlapKind::GemmThenReduce, {a, b}, d, in, R{3999, 4100}),
            "");
  // Touching ranges do not overlap.
  EXPECT_EQ(gpu::overlap_memory_refusal(OverlapKind::GemmThenReduce, {a, b}, d, in, R{4000, 4100}),
            "");
  const R share{100, 200}, gathered{200, 400};
  EXPECT_EQ(
      gpu::overlap_memory_refusal(OverlapKind::GatherThenGemm, {gathered, b}, d, share, gathered),
      "");
  EXPECT_NE(gpu::overlap_memory_refusal(OverlapKind::GatherThenGemm, {gathered, b}, R{150, 190},
                                        share, gathered),
            "");
  EXPECT_NE(gpu::overlap_memory_refusal(OverlapKind::GatherThenGemm, {gathered, b}, R{300, 500},
                                        share, gathered),
            "");
}

}  // namespace
}  // namespace opfuse
