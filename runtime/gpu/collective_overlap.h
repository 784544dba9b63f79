// Note "Pipelined collectives" (gpu/executor_run.cpp): which GEMMs of a tensor-parallel plan run
// in row pieces around the collective next to them, and the pieces. Pure: no device, so CPU tests
// check the pairs a plan offers and that every schedule computes what the unpipelined pair does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace opfuse::gpu {

enum class OverlapKind : std::uint8_t {
  GemmThenReduce,  // a GEMM whose D only an all_reduce or reduce_scatter reads (fc2's fprop)
  GatherThenGemm,  // an all_gather whose output is the next GEMM's A (fc1's fprop under sp)
};

// Two adjacent steps of one phase: the GEMM and the collective, by step index.
struct OverlapPair {
  OverlapKind kind = OverlapKind::GemmThenReduce;
  int gemm = -1;
  int collective = -1;
  int head() const { return kind == OverlapKind::GemmThenReduce ? gemm : collective; }
  friend bool operator==(const OverlapPair&, const OverlapPair&) = default;
};

// The pairs of `plan` whose GEMM may run in row pieces, from the plan's structure alone (the
// executor also checks the bound memory: overlap_memory_refusal). A GEMM qualifies when its rows
// (D's and, not transposed, A's) are the collective's dim 0, its FP8 operands have per-tensor
// scales (a scale grid would need cutting too), it writes no FP8 D (cuBLASLt's amax of D would be
// one piece's) and no aux matrix, it does not accumulate and, for GemmThenReduce, nothing but the
// collective reads its D (the pieces may lay D out in the collective's order), and the reduction
// has nothing to run beside otherwise: it ends its phase, or the next step reads its output (fc1's
// dgrad reduction overlaps fc1's wgrad GEMM unpipelined, note "Overlapped collectives"). Empty for
// a plan that is not tensor-parallel.
std::vector<OverlapPair> find_overlap_pairs(const plan::SequencePlan& plan);

// Rows [a_row, a_row + rows) of A (of the gather's input, this rank's share, when `local`; else
// of the GEMM's A) into rows [d_row, d_row + rows) of D.
struct GemmPiece {
  std::int64_t a_row = 0, d_row = 0, rows = 0;
  bool local = false;
  friend bool operator==(const GemmPiece&, const GemmPiece&) = default;
};

// One stage of a schedule: its GEMM pieces, in order.
//  - GemmThenReduce: then the collective over D's rows [in_row, in_row + in_rows), which sends
//    its result to the collective output's rows from out_row (all_reduce: the same rows;
//    reduce_scatter: this rank's in_rows / tp rows of its share).
//  - GatherThenGemm: stage 0 runs beside the gather, stage 1 after it.
struct OverlapStage {
  std::vector<GemmPiece> pieces;
  std::int64_t in_row = 0, in_rows = 0, out_row = 0;
};

struct OverlapSchedule {
  std::vector<OverlapStage> stages;  // empty: run the pair as two plain steps
};

// The fewest rows whose bytes are a multiple of 256 in every matrix a piece offsets (A's rows of
// a_row_bytes, D's of d_row_bytes), so each piece's pointers keep the pool's alignment and the
// GEMM its algorithm class.
std::int64_t overlap_row_granule(std::int64_t a_row_bytes, std::int64_t d_row_bytes);

// GemmThenReduce over D's m rows, tp ranks, at most `chunks` stages of whole granules.
//  - all_reduce: stage s is D's rows [r_s, r_s + n_s): one piece, then the all-reduce of them.
//  - reduce_scatter: every rank's share (m / tp rows) is cut the same way into pieces of p_s
//    rows at offsets o_s; stage s computes piece s of every share, rank r's into D's rows
//    tp * o_s + r * p_s, so the stage's rows are contiguous in the order NCCL's reduce-scatter
//    expects ([rank][rows]) and rank r receives its share's rows [o_s, o_s + p_s).
// Empty when the rows do not split (fewer than two granules per stage's unit) or chunks < 2.
OverlapSchedule reduce_schedule(plan::CollectiveKind kind, std::int64_t m, int tp, int chunks,
                                std::int64_t granule);

// GatherThenGemm over D's m rows gathered from tp shares: stage 0 is this rank's share, read
// from the gather's input while the gather runs; stage 1 the other ranks' rows (one or two
// pieces), read from the gathered A after it. Empty when tp < 2 or the shares break the 16-byte
// alignment cuBLASLt needs (share bytes of A or D not a multiple of 16).
OverlapSchedule gather_schedule(std::int64_t m, int tp, int rank, std::int64_t a_row_bytes,
                                std::int64_t d_row_bytes);

// Why the bound memory forbids pipelining the pair (empty: it allows it). Ranges are [begin, end)
// addresses. GemmThenReduce: the collective's output may not overlap what later pieces read or
// write (A, B, bias, D). GatherThenGemm: D may not overlap the gather's input or output (the
// memory plan may put D where the share was, its last reader being the gather).
using AddressRange = std::pair<std::uintptr_t, std::uintptr_t>;
std::string overlap_memory_refusal(OverlapKind kind, const std::vector<AddressRange>& gemm_reads,
                                   AddressRange d, AddressRange collective_in,
                                   AddressRange collective_out);

// One line each for reports (SequenceExecutor::collective_overlap): the SMs a GEMM leaves a
// collective in flight (`collective_sms` of `num_sms`, 0: none), then each of `pairs` with the
// steps' descriptions and, for a GemmThenReduce, its `chunks` stages; or why none is pipelined.
std::vector<std::string> describe_overlap(const plan::SequencePlan& plan,
                                          const std::vector<OverlapPair>& pairs, int chunks,
                                          int collective_sms, int num_sms);

}  // namespace opfuse::gpu
