// The executor's communicators (docs/parallel.md): the tensor-parallel group its collectives run
// over, with the SMs a GEMM leaves them and the GEMMs pipelined with them (notes "Overlapped
// collectives" and "Pipelined collectives" in executor_run.cpp), and the amax reduction over the
// tensor-parallel ranks and the data-parallel group (note "Amax reduction").
#include <cstdlib>
#include <optional>
#include <string_view>

#include "gpu/executor_impl.h"

namespace opfuse::gpu {

namespace {

// $name as an integer in [low, high]; nullopt when unset. UsageError "NAME=TEXT: `what`" when it is
// not one.
std::optional<int> environment_int(const char* name, int low, int high, std::string_view what) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < low || value > high)
    throw UsageError(fmt::format("{}={}: {}", name, text, what));
  return static_cast<int>(value);
}

}  // namespace

void SequenceExecutor::set_communicator(comm::Communicator* communicator) {
  Impl& s = *impl_;
  if (communicator != nullptr && communicator->size() != s.plan.parallel.tp) {
    throw UsageError(
        fmt::format("sequence '{}' is {} over {} rank{}, but the communicator has {}", s.plan.name,
                    s.plan.parallel.active() ? "tensor-parallel" : "built", s.plan.parallel.tp,
                    s.plan.parallel.tp == 1 ? "" : "s", communicator->size()));
  }
  s.communicator = communicator;
  s.pending_collectives.clear();
  s.collective_stream.reset();
  if (communicator != nullptr) {  // note "Overlapped collectives"
    s.collective_stream = std::make_unique<CollectiveStream>(s.plan.steps.size());
    // One rank's collectives are trivial: its GEMMs keep every SM (and so the plain path's
    // algorithms, bit for bit).
    s.collective_sms = s.plan.parallel.active() ? kCollectiveSms : 0;
    const std::optional<int> sms = environment_int(
        "OPFUSE_COLLECTIVE_SMS", 0, s.num_sms - 1,
        fmt::format("give the SMs a GEMM leaves to a collective beside it, from 0 (no limit) to {}",
                    s.num_sms - 1));
    if (sms && s.plan.parallel.active()) s.collective_sms = *sms;
    // Note "Pipelined collectives" (executor_run.cpp).
    s.collective_chunks = environment_int("OPFUSE_COLLECTIVE_CHUNKS", 1, 64,
                                          "give the stages a GEMM and the collective next to it "
                                          "are pipelined in, from 1 (not pipelined) to 64")
                              .value_or(kCollectiveChunks);
  }
  s.overlap_pairs.clear();
  s.overlap_at.assign(s.plan.steps.size(), -1);
  if (communicator != nullptr && s.collective_chunks > 1) {
    s.overlap_pairs = find_overlap_pairs(s.plan);
    for (std::size_t p = 0; p < s.overlap_pairs.size(); ++p)
      s.overlap_at[static_cast<std::size_t>(s.overlap_pairs[p].head())] = static_cast<int>(p);
  }
}

std::vector<std::string> SequenceExecutor::collective_overlap() const {
  const Impl& s = *impl_;
  if (s.communicator == nullptr || !s.plan.parallel.active()) return {};
  return describe_overlap(s.plan, s.overlap_pairs, s.collective_chunks, s.collective_sms,
                          s.num_sms);
}

// Note "Amax reduction": every rank must cast with the scale of the whole tensor (TE's amax
// reduction over the group), so the amax each delayed-scaling quantizer's kernels raised this
// step is replaced by the max over the ranks before the one scale-update launch. The amaxes of
// all quantizers sit in one contiguous section of the quantizer state (gpu/quantizer_state.h), so
// this is ONE all-reduce (MAX) of count 16-byte slots per step, whatever the number of
// quantizers; the padding and the slots of other quantizers are zero on every rank and stay so.
// A benchmark's observer sees it as the step after the plan's last (step_profiles). Data-parallel
// replicas (set_amax_communicator) reduce the same array once more over their group: the max over
// every rank of every replica, TE's amax reduction over its fp8 group.
bool SequenceExecutor::Impl::reduces_amaxes() const {
  if ((communicator == nullptr && amax_communicator == nullptr) || !quantizers) return false;
  for (int i = 0; i < quantizers->count(); ++i) {
    const QuantizerSettings& q = quantizers->settings(i);
    if (!q.current_scaling && !q.block_scaled) return true;
  }
  return false;
}

void SequenceExecutor::Impl::reduce_amaxes(cudaStream_t stream) {
  if (!reduces_amaxes()) return;
  const int index = static_cast<int>(plan.steps.size());
  if (observer != nullptr) observer->before(index, stream);
  for (comm::Communicator* group : {communicator, amax_communicator}) {
    if (group == nullptr) continue;
    group->all_reduce(quantizers->amaxes(), quantizers->amaxes(), quantizers->amaxes_floats(),
                      plan::DType::FP32, comm::ReduceOp::Max, stream);
  }
  if (observer != nullptr) observer->after(index, stream);
}

void SequenceExecutor::set_amax_communicator(comm::Communicator* communicator) {
  impl_->amax_communicator = communicator;
}

}  // namespace opfuse::gpu
