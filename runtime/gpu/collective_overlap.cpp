#include "gpu/collective_overlap.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <variant>

namespace opfuse::gpu {

namespace {

int root_of(const plan::SequencePlan& plan, int buffer) {
  const plan::Buffer& b = plan.buffers.at(static_cast<std::size_t>(buffer));
  return b.root >= 0 ? b.root : b.id;
}

// A GEMM the pieces can cut by rows (the conditions of find_overlap_pairs' comment).
bool cuttable(const plan::GemmStep& gemm) {
  return !gemm.a_transposed && gemm.a.scale_inv.buffer < 0 && gemm.b.scale_inv.buffer < 0 &&
         gemm.d_quantizer < 0 && !plan::dtype_is_fp8(gemm.d_dtype) &&
         (gemm.epilogue == plan::GemmEpilogue::None || gemm.epilogue == plan::GemmEpilogue::Bias) &&
         !gemm.accumulate && gemm.aux < 0 && !gemm.inference_epilogue && !gemm.training_epilogue;
}

// Whether any step but `only` names memory of root `root` (either run mode), or the caller reads
// it back.
bool read_elsewhere(const plan::SequencePlan& plan, int root, int writer, int only) {
  for (const plan::Buffer& b : plan.buffers)
    if (root_of(plan, b.id) == root && !b.interface.empty()) return true;
  for (const plan::Step& step : plan.steps) {
    if (step.index == writer || step.index == only) continue;
    for (const bool inference : {false, true}) {
      for (int buffer : plan::buffers_named_by(step, inference))
        if (root_of(plan, buffer) == root) return true;
    }
  }
  return false;
}

// `total` cut into at most `parts` runs of whole granules, the last taking the rest.
std::vector<std::int64_t> cut(std::int64_t total, int parts, std::int64_t granule) {
  if (granule <= 0 || total % granule != 0) return {};
  const std::int64_t granules = total / granule;
  const std::int64_t n = std::min<std::int64_t>(parts, granules);
  if (n < 2) return {};
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(n), granules / n * granule);
  sizes.back() += total - granules / n * granule * n;
  return sizes;
}

bool overlaps(AddressRange a, AddressRange b) {
  return a.first < a.second && b.first < b.second && a.first < b.second && b.first < a.second;
}

// Whether nothing could run beside collective step `index` unpipelined: it ends its phase (a
// forward must end complete), or the next step of its phase touches its output. A reduction
// followed by independent work (fc1's dgrad reduction and fc1's wgrad GEMM) already overlaps
// that work (note "Overlapped collectives"); cutting its GEMM would only cost the pieces.
bool exposed(const plan::SequencePlan& plan, std::size_t index) {
  if (index + 1 >= plan.steps.size()) return true;
  const plan::Step& next = plan.steps[index + 1];
  if (next.phase != plan.steps[index].phase || next.group < 0) return true;
  const int output = root_of(plan, std::get<plan::CollectiveStep>(plan.steps[index].body).output);
  for (const bool inference : {false, true}) {
    for (int buffer : plan::buffers_named_by(next, inference))
      if (root_of(plan, buffer) == output) return true;
  }
  return false;
}

}  // namespace

std::vector<OverlapPair> find_overlap_pairs(const plan::SequencePlan& plan) {
  std::vector<OverlapPair> pairs;
  if (!plan.parallel.active()) return pairs;
  for (std::size_t i = 0; i + 1 < plan.steps.size(); ++i) {
    const plan::Step& first = plan.steps[i];
    const plan::Step& second = plan.steps[i + 1];
    if (first.phase != second.phase || first.group < 0 || second.group < 0) continue;
    const auto* gemm = std::get_if<plan::GemmStep>(&first.body);
    const auto* reduce = std::get_if<plan::CollectiveStep>(&second.body);
    if (gemm != nullptr && reduce != nullptr && cuttable(*gemm) &&
        reduce->kind != plan::CollectiveKind::AllGather && reduce->input == gemm->d &&
        root_of(plan, gemm->d) == gemm->d && reduce->dtype == gemm->d_dtype &&
        !read_elsewhere(plan, gemm->d, first.index, second.index) && exposed(plan, i + 1)) {
      pairs.push_back({OverlapKind::GemmThenReduce, first.index, second.index});
      continue;
    }
    const auto* gather = std::get_if<plan::CollectiveStep>(&first.body);
    const auto* next = std::get_if<plan::GemmStep>(&second.body);
    if (gather != nullptr && next != nullptr && cuttable(*next) &&
        gather->kind == plan::CollectiveKind::AllGather && next->a.buffer == gather->output &&
        gather->dtype == next->a.dtype) {
      pairs.push_back({OverlapKind::GatherThenGemm, second.index, first.index});
    }
  }
  return pairs;
}

std::int64_t overlap_row_granule(std::int64_t a_row_bytes, std::int64_t d_row_bytes) {
  const auto rows_for = [](std::int64_t row_bytes) {
    return row_bytes <= 0 ? std::int64_t{1} : 256 / std::gcd(row_bytes, std::int64_t{256});
  };
  return std::lcm(rows_for(a_row_bytes), rows_for(d_row_bytes));
}

OverlapSchedule reduce_schedule(plan::CollectiveKind kind, std::int64_t m, int tp, int chunks,
                                std::int64_t granule) {
  OverlapSchedule schedule;
  if (kind == plan::CollectiveKind::AllGather || tp < 1 || chunks < 2 || m % tp != 0)
    return schedule;
  if (kind == plan::CollectiveKind::AllReduce) {
    std::int64_t row = 0;
    for (std::int64_t rows : cut(m, chunks, granule)) {
      schedule.stages.push_back({{{row, row, rows, false}}, row, rows, row});
      row += rows;
    }
    return schedule;
  }
  const std::int64_t share = m / tp;
  std::int64_t offset = 0;
  for (std::int64_t rows : cut(share, chunks, granule)) {
    OverlapStage stage{{}, tp * offset, tp * rows, offset};
    for (int r = 0; r < tp; ++r)
      stage.pieces.push_back({r * share + offset, tp * offset + r * rows, rows, false});
    schedule.stages.push_back(std::move(stage));
    offset += rows;
  }
  return schedule;
}

OverlapSchedule gather_schedule(std::int64_t m, int tp, int rank, std::int64_t a_row_bytes,
                                std::int64_t d_row_bytes) {
  OverlapSchedule schedule;
  if (tp < 2 || rank < 0 || rank >= tp || m % tp != 0) return schedule;
  const std::int64_t share = m / tp;
  if (share * a_row_bytes % 16 != 0 || share * d_row_bytes % 16 != 0) return schedule;
  const std::int64_t mine = rank * share;
  OverlapStage beside{{{0, mine, share, true}}, 0, 0, 0};
  OverlapStage after;
  if (rank > 0) after.pieces.push_back({0, 0, mine, false});
  if (rank + 1 < tp) after.pieces.push_back({mine + share, mine + share, m - mine - share, false});
  schedule.stages = {std::move(beside), std::move(after)};
  return schedule;
}

std::vector<std::string> describe_overlap(const plan::SequencePlan& plan,
                                          const std::vector<OverlapPair>& pairs, int chunks,
                                          int collective_sms, int num_sms) {
  std::vector<std::string> lines;
  lines.push_back(collective_sms > 0
                      ? fmt::format("a GEMM beside a collective in flight leaves it {} of the {} "
                                    "SMs (OPFUSE_COLLECTIVE_SMS)",
                                    collective_sms, num_sms)
                      : std::string("a GEMM beside a collective in flight takes every SM "
                                    "(OPFUSE_COLLECTIVE_SMS=0)"));
  if (pairs.empty()) {
    lines.push_back(chunks > 1 ? std::string("no GEMM pipelined with a collective (none qualifies)")
                               : std::string("no GEMM pipelined with a collective "
                                             "(OPFUSE_COLLECTIVE_CHUNKS=1)"));
  }
  for (const OverlapPair& pair : pairs) {
    const std::string& gemm = plan.steps.at(static_cast<std::size_t>(pair.gemm)).what;
    const std::string& collective = plan.steps.at(static_cast<std::size_t>(pair.collective)).what;
    lines.push_back(pair.kind == OverlapKind::GemmThenReduce
                        ? fmt::format("steps {} and {} pipelined in {} stages "
                                      "(OPFUSE_COLLECTIVE_CHUNKS): {}, then {}",
                                      pair.gemm, pair.collective, chunks, gemm, collective)
                        : fmt::format("steps {} and {} pipelined: {} beside {} (this rank's rows "
                                      "first)",
                                      pair.collective, pair.gemm, collective, gemm));
  }
  return lines;
}

std::string overlap_memory_refusal(OverlapKind kind, const std::vector<AddressRange>& gemm_reads,
                                   AddressRange d, AddressRange collective_in,
                                   AddressRange collective_out) {
  if (kind == OverlapKind::GemmThenReduce) {
    if (overlaps(collective_out, d)) return "the collective's output shares memory with D";
    for (const AddressRange& read : gemm_reads) {
      if (overlaps(collective_out, read))
        return "the collective's output shares memory with an operand of the GEMM";
    }
    return {};
  }
  if (overlaps(d, collective_in)) return "D shares memory with the gather's input";
  if (overlaps(d, collective_out)) return "D shares memory with the gathered tensor";
  return {};
}

}  // namespace opfuse::gpu
