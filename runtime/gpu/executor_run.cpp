// Running steps: liveness (mark_live, mark_dead), the weight cache (note "Weight cache" in
// plan_executor.cpp: cache_valid, mark_cast, keep_cast_scale_inv), run_steps() over a range of
// one run mode, run_step() enqueueing one launch or GEMM, the observer hook, and result()
// behind output(), input_grad() and param_grad().
#include "gpu/executor_impl.h"

namespace opfuse::gpu {

void SequenceExecutor::Impl::mark_live(int root) {
  const auto r = static_cast<std::size_t>(root);
  if (live[r] != 0) return;
  live[r] = 1;
  live_bytes += bytes[r];
  peak_bytes = std::max(peak_bytes, live_bytes);
}

void SequenceExecutor::Impl::mark_dead(int root) {
  const auto r = static_cast<std::size_t>(root);
  if (live[r] == 0) return;
  live[r] = 0;
  live_bytes -= bytes[r];
}

void SequenceExecutor::Impl::mark_all_dead(bool keep_weight_cache) {
  for (std::size_t id = 0; id < live.size(); ++id) {
    if (keep_weight_cache && facts[id].weight_cache) continue;
    mark_dead(static_cast<int>(id));
  }
}

bool SequenceExecutor::Impl::cache_valid(const WeightCacheGroup& group) const {
  if (!group.valid) return false;
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    if (caller_pointers[static_cast<std::size_t>(group.params[i])] != group.cast_from[i]) {
      return false;
    }
  }
  return true;
}

void SequenceExecutor::Impl::run_steps(int begin, int end, cudaStream_t stream, RunMode mode,
                                       bool enqueue) {
  last_stream = stream;
  for (std::size_t g = 0; g < cache_groups.size(); ++g)
    skip_group[g] = cache_valid(cache_groups[g]) ? 1 : 0;
  const int m = mode_index(mode);
  for (int index = begin; index < end; ++index) {
    const auto i = static_cast<std::size_t>(index);
    if (plan.steps[i].group < 0) continue;  // the end-of-step scale update: end_step() runs it
    const int group = cache_group_of_step[i];
    if (group >= 0 && skip_group[static_cast<std::size_t>(group)] != 0) continue;
    // Note "Pipelined collectives": a pair's second step is the next one.
    const int pair = overlap_at.empty() ? -1 : overlap_at[i];
    if (enqueue && pair >= 0 && index + 1 < end &&
        run_overlapped(overlap_pairs[static_cast<std::size_t>(pair)], m, stream)) {
      ++index;
      continue;
    }
    run_listed_step(index, m, stream, enqueue);
  }
  if (enqueue) join_all(stream);
  for (WeightCacheGroup& group : cache_groups) {
    if (group.steps.front() < begin || group.steps.back() >= end) continue;
    mark_cast(group);
  }
}

void SequenceExecutor::Impl::mark_step_live(int index, int m) {
  for (int root : touched[m][static_cast<std::size_t>(index)]) {
    if (!facts[static_cast<std::size_t>(root)].callers) mark_live(root);
  }
}

void SequenceExecutor::Impl::mark_step_done(int index, int m) {
  for (int root : free_after[m][static_cast<std::size_t>(index)]) mark_dead(root);
}

void SequenceExecutor::Impl::run_listed_step(int index, int m, cudaStream_t stream, bool enqueue) {
  const auto i = static_cast<std::size_t>(index);
  mark_step_live(index, m);
  if (enqueue) {
    join_overlapping(index, m, stream);
    if (collective_stream && std::holds_alternative<plan::CollectiveStep>(plan.steps[i].body)) {
      fork_collective(index, m, stream);
    } else {
      observed_step(index, stream);
      if (block_summaries) {
        block_summaries->after_step(
            index, m == mode_index(RunMode::Inference),
            [this](int buffer) { return pointer(buffer); }, quantizers ? &*quantizers : nullptr,
            symbols, stream);
      }
    }
    const int group = cache_group_of_step[i];
    if (group >= 0 && cache_groups[static_cast<std::size_t>(group)].steps.back() == index) {
      keep_cast_scale_inv(cache_groups[static_cast<std::size_t>(group)], stream);
      ++cache_groups[static_cast<std::size_t>(group)].casts;  // note "Fused GEMM epilogues"
    }
  }
  mark_step_done(index, m);
}

void SequenceExecutor::Impl::mark_cast(WeightCacheGroup& group) {
  group.valid = true;
  group.cast_from.clear();
  for (int param : group.params) {
    group.cast_from.push_back(caller_pointers[static_cast<std::size_t>(param)]);
  }
}

const BoundStep& SequenceExecutor::Impl::bound_at(int index) const {
  const auto i = static_cast<std::size_t>(index);
  return layout == RunMode::Inference && inference_steps[i] ? *inference_steps[i] : steps[i];
}

GemmArgs SequenceExecutor::Impl::bound_gemm_args(int index) const {
  const GemmStep& gemm = std::get<GemmStep>(plan.steps[static_cast<std::size_t>(index)].body);
  GemmArgs args = gemm_args(
      gemm, bound_at(index).gemm, [this](int buffer) { return pointer(buffer); },
      quantizers ? &*quantizers : nullptr);
  if (cast_scale_inv.data() != nullptr) {  // fp8_weights: the scale the copy was cast with
    const auto cached = [this](const plan::GemmOperand& operand) {
      return operand.scale_inv.quantizer >= 0 &&
             facts[static_cast<std::size_t>(facts[static_cast<std::size_t>(operand.buffer)].root)]
                 .weight_cache;
    };
    if (args.a_scale_inv != nullptr && cached(gemm.a))
      args.a_scale_inv = cast_scale_inv_slot(gemm.a.scale_inv.quantizer);
    if (args.b_scale_inv != nullptr && cached(gemm.b))
      args.b_scale_inv = cast_scale_inv_slot(gemm.b.scale_inv.quantizer);
  }
  return args;
}

void SequenceExecutor::Impl::run_step(int index, cudaStream_t stream) {
  const auto i = static_cast<std::size_t>(index);
  const Step& step = plan.steps[i];
  BoundStep& bound_step =
      layout == RunMode::Inference && inference_steps[i] ? *inference_steps[i] : steps[i];
  const OperationScope scope(step_labels[i]);  // note "Faulted context" (gpu/cuda_check.h)
  if (std::holds_alternative<LaunchStep>(step.body)) {
    if (bound_step.skip || folded(index)) return;
    bound_step.params.set_buffers([this](int buffer) { return pointer(buffer); });
    gpu::launch(*bound_step.kernel, bound_step.grid, bound_step.block, bound_step.dynamic_smem,
                stream, bound_step.params.bytes.data(), bound_step.params.bytes.size());
    if (!bound_step.finish_current.empty()) finish_current_scales(bound_step, stream);
    if (check_each_step()) synchronize_after(index, bound_step.kernel->name(), stream);
  } else if (const auto* collective = std::get_if<plan::CollectiveStep>(&step.body)) {
    run_collective(*collective, bound_step.collective_count, stream);
    if (check_each_step()) synchronize_after(index, "NCCL's collective", stream);
  } else {
    const GemmArgs args = bound_gemm_args(index);
    if (runs_fused(index)) {
      run_fused(index, args, stream);
      if (check_each_step()) synchronize_after(index, "the fused gated GEMM (CUTLASS)", stream);
      return;
    }
    // Note "Overlapped collectives": beside a collective in flight, the GEMM leaves it SMs.
    GemmDesc desc = bound_step.gemm;
    if (!pending_collectives.empty() && collective_sms > 0 && collective_sms < num_sms)
      desc.sm_count_target = num_sms - collective_sms;
    gemms.run(desc, args, stream);
    if (check_each_step())
      synchronize_after(index, fmt::format("cuBLASLt's {}", describe(desc)), stream);
  }
}

// Note "Collectives": a one-rank plan's collectives are copies (an all_reduce of one rank is
// the tensor, a gather or scatter over one rank its only share), so a tp = 1 plan needs no NCCL
// (unless it was given a one-rank communicator: then NCCL's calls, as N ranks make them); a
// tensor-parallel plan enqueues NCCL's on the same stream, ordered with the launches and GEMMs
// around it and captured with them in CUDA graphs.
void SequenceExecutor::Impl::run_collective(const plan::CollectiveStep& collective,
                                            std::int64_t count, cudaStream_t stream) {
  enqueue_collective(collective, pointer(collective.input),
                     const_cast<void*>(pointer(collective.output)), count, stream);
}

void SequenceExecutor::Impl::enqueue_collective(const plan::CollectiveStep& collective,
                                                const void* in, void* out, std::int64_t count,
                                                cudaStream_t stream) {
  const auto n = static_cast<std::size_t>(count);
  if (communicator == nullptr) {  // require_set refused a tensor-parallel plan without one
    if (in != out)
      OPFUSE_CUDA_CHECK(cudaMemcpyAsync(out, in, n * plan::dtype_bytes(collective.dtype),
                                        cudaMemcpyDeviceToDevice, stream),
                        "a one-rank collective");
    return;
  }
  const auto tp = static_cast<std::size_t>(plan.parallel.tp);
  switch (collective.kind) {
    case plan::CollectiveKind::AllReduce:
      communicator->all_reduce(in, out, n, collective.dtype, comm::ReduceOp::Sum, stream);
      break;
    case plan::CollectiveKind::AllGather:
      communicator->all_gather(in, out, n, collective.dtype, stream);
      break;
    case plan::CollectiveKind::ReduceScatter:
      communicator->reduce_scatter(in, out, n / tp, collective.dtype, comm::ReduceOp::Sum, stream);
      break;
  }
}

// Note "Overlapped collectives": a tensor-parallel step's collectives need not hold up the steps
// that do not depend on them, e.g. the all-reduce of fc1's input gradient and fc1's wgrad GEMM
// (TE overlaps the two the same way), or a gather and the next weight's cast. Each collective
// runs on the CollectiveStream (high priority, so NCCL's few blocks get SMs beside a GEMM's):
// forked from the session's stream after the steps before it (event `ready`), its completion
// recorded (event `done`). The session's stream waits for `done` before the first later step
// whose memory overlaps the collective's input or output (its consumer, or a step the memory plan
// placed in memory the collective still reads or writes), and for every pending collective at
// the end of the run, so a forward or backward ends as complete on the session's stream as
// before, and a CUDA graph captured from it joins the fork back. The ranks issue their
// collectives in the same order (one stream each), as NCCL requires. A GEMM launched while a
// collective is in flight would otherwise take every SM for its whole run (cuBLASLt's Hopper
// kernels are persistent) and NCCL's blocks would wait for it to end: such a GEMM runs on all
// but collective_sms SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, as TE does for its overlapped
// GEMMs); OPFUSE_COLLECTIVE_SMS sets how many (default kCollectiveSms, 0: no limit).
// Note "Current scaling over ranks": every rank must cast a tensor-parallel tensor with the scale
// of the whole tensor (the CPU reference's reduce_amax hook), so a current-scaling amax cannot
// become a scale inside the kernel that measures this rank's part. Such a kernel runs without
// its quantizer record (bind_launch); after it, on the same stream, the running max it raised is
// max-reduced over the ranks in place (one NCCL group for the step's quantizers) and one small
// launch per quantizer takes it as the measured amax and derives scale and scale_inv
// (QuantizerState::finish_current), bit for bit the one-rank formula. The cast that reads the
// scale follows on the stream. One all-reduce of one word per measured tensor, on the critical
// path (TE's current scaling reduces its amax the same way).
void SequenceExecutor::Impl::finish_current_scales(const BoundStep& bound_step,
                                                   cudaStream_t stream) {
  {
    comm::GroupScope group(*communicator);
    for (int q : bound_step.finish_current) {
      float* running = quantizers->running_amax(q);
      communicator->all_reduce(running, running, 1, plan::DType::FP32, comm::ReduceOp::Max, stream);
    }
    group.end();
  }
  for (int q : bound_step.finish_current) quantizers->finish_current(q, stream);
}

std::pair<std::uintptr_t, std::uintptr_t> SequenceExecutor::Impl::range_of(int root) const {
  const auto begin = reinterpret_cast<std::uintptr_t>(pointer(root));
  return {begin, begin + bytes[static_cast<std::size_t>(root)]};
}

void SequenceExecutor::Impl::fork_collective(int index, int m, cudaStream_t stream) {
  const auto i = static_cast<std::size_t>(index);
  CollectiveStream& side = *collective_stream;
  OPFUSE_CUDA_CHECK(cudaEventRecord(side.ready(i), stream), "forking a collective");
  OPFUSE_CUDA_CHECK(cudaStreamWaitEvent(side.stream(), side.ready(i), 0), "forking a collective");
  observed_step(index, side.stream());
  OPFUSE_CUDA_CHECK(cudaEventRecord(side.done(i), side.stream()), "forking a collective");
  PendingCollective pending{index, {}};
  for (int root : touched[m][i]) pending.ranges.push_back(range_of(root));
  pending_collectives.push_back(std::move(pending));
}

void SequenceExecutor::Impl::join_overlapping(int index, int m, cudaStream_t stream, int except) {
  if (pending_collectives.empty()) return;
  const auto& roots = touched[m][static_cast<std::size_t>(index)];
  std::erase_if(pending_collectives, [&](const PendingCollective& pending) {
    if (pending.step == except) return false;
    const bool overlaps = std::ranges::any_of(roots, [&](int root) {
      const std::pair<std::uintptr_t, std::uintptr_t> mine = range_of(root);
      return std::ranges::any_of(pending.ranges, [&](const auto& range) {
        return mine.first < range.second && range.first < mine.second;
      });
    });
    if (overlaps) {
      OPFUSE_CUDA_CHECK(
          cudaStreamWaitEvent(stream,
                              collective_stream->done(static_cast<std::size_t>(pending.step)), 0),
          "joining a collective");
    }
    return overlaps;
  });
}

void SequenceExecutor::Impl::join_all(cudaStream_t stream) {
  for (const PendingCollective& pending : pending_collectives) {
    OPFUSE_CUDA_CHECK(
        cudaStreamWaitEvent(stream, collective_stream->done(static_cast<std::size_t>(pending.step)),
                            0),
        "joining a collective");
  }
  pending_collectives.clear();
}

// Note "Pipelined collectives": a collective next to the GEMM that makes or reads its tensor need
// not wait for the whole GEMM, nor the GEMM for the whole collective, when the GEMM's rows are the
// collective's dim 0 (find_overlap_pairs, gpu/collective_overlap.h). TE's split pipelined
// comm-GEMM overlap, over NCCL's calls instead of its own transport:
//  - GemmThenReduce (fc2's fprop and the all_reduce or reduce_scatter ending the forward): the
//    GEMM runs in stages of row pieces (OPFUSE_COLLECTIVE_CHUNKS, default kCollectiveChunks),
//    each stage's rows reduced on the collective stream while the next stage computes, so only
//    the last stage's reduction waits for the end of the GEMM. A reduce_scatter's stage
//    computes the same piece of every rank's share into contiguous rows of D ([rank][rows],
//    reduce_schedule), which only the collective reads. fc1's dgrad reduction is not cut: it
//    already runs beside fc1's wgrad GEMM, and the pieces would only cost (bench/RESULTS.md).
//  - GatherThenGemm (fc1's fprop under sequence parallelism, fc2's dgrad of the gathered output
//    gradient): the GEMM computes this rank's rows from its own share while the gather runs,
//    and the other ranks' rows after it.
// The collective forks and joins as in note "Overlapped collectives": the pieces beside one in
// flight leave it collective_sms SMs. Every piece is the plan's GEMM on fewer rows, so each row
// is the same dot products; cuBLASLt may pick another algorithm for a piece's size, so the
// results agree with the unpipelined GEMM's to rounding, as any two algorithms do. Not pipelined
// (run as two plain steps): a fused GEMM, block summaries, a weight-cast group, rows that do not
// split into granules of 256-byte pointers, and memory the stages would race on
// (overlap_memory_refusal: the memory plan may place the collective's output where an operand was).
// A benchmark's observer (whose before and after calls pair up one step at a time) sees the GEMM
// from its first piece to its last on the session's stream, and the collective as its last stage
// on the collective stream: the part of it the GEMM did not hide.
bool SequenceExecutor::Impl::run_overlapped(const OverlapPair& pair, int m, cudaStream_t stream) {
  if (!collective_stream || communicator == nullptr || block_summaries || runs_fused(pair.gemm) ||
      cache_group_of_step[static_cast<std::size_t>(pair.gemm)] >= 0 ||
      cache_group_of_step[static_cast<std::size_t>(pair.collective)] >= 0)
    return false;
  const auto c = static_cast<std::size_t>(pair.collective);
  const auto& collective = std::get<plan::CollectiveStep>(plan.steps[c].body);
  const GemmDesc& desc = bound_at(pair.gemm).gemm;
  const std::int64_t a_row = plan::dtype_bytes(desc.a) * desc.k;
  const std::int64_t d_row = plan::dtype_bytes(desc.d) * desc.n;
  const OverlapSchedule schedule =
      pair.kind == OverlapKind::GemmThenReduce
          ? reduce_schedule(collective.kind, desc.m, plan.parallel.tp, collective_chunks,
                            overlap_row_granule(a_row, d_row))
          : gather_schedule(desc.m, plan.parallel.tp, communicator->rank(), a_row, d_row);
  if (schedule.stages.empty()) return false;
  const GemmArgs args = bound_gemm_args(pair.gemm);
  const auto& gemm = std::get<GemmStep>(plan.steps[static_cast<std::size_t>(pair.gemm)].body);
  const auto root_range = [this](int buffer) {
    return range_of(facts[static_cast<std::size_t>(buffer)].root);
  };
  std::vector<AddressRange> reads = {root_range(gemm.a.buffer), root_range(gemm.b.buffer)};
  if (gemm.bias >= 0) reads.push_back(root_range(gemm.bias));
  if (!overlap_memory_refusal(pair.kind, reads, root_range(gemm.d), root_range(collective.input),
                              root_range(collective.output))
           .empty())
    return false;

  CollectiveStream& side = *collective_stream;
  const auto beside = [this](const GemmDesc& piece) {
    GemmDesc d = piece;
    if (!pending_collectives.empty() && collective_sms > 0 && collective_sms < num_sms)
      d.sm_count_target = num_sms - collective_sms;
    return d;
  };
  const auto* a = static_cast<const char*>(args.a);
  auto* d = static_cast<char*>(args.d);
  if (pair.kind == OverlapKind::GatherThenGemm) {
    run_listed_step(pair.collective, m, stream, true);  // forks the gather
    mark_step_live(pair.gemm, m);
    join_overlapping(pair.gemm, m, stream, pair.collective);
    if (observer != nullptr) observer->before(pair.gemm, stream);
    const auto* local = static_cast<const char*>(pointer(collective.input));
    for (const GemmPiece& piece : schedule.stages[0].pieces)
      run_gemm_piece(pair.gemm, beside(desc), args, piece, local, stream);
    OPFUSE_CUDA_CHECK(cudaStreamWaitEvent(stream, side.done(c), 0), "joining a gather");
    std::erase_if(pending_collectives,
                  [&](const PendingCollective& p) { return p.step == pair.collective; });
    for (const GemmPiece& piece : schedule.stages[1].pieces)
      run_gemm_piece(pair.gemm, beside(desc), args, piece, a, stream);
    if (observer != nullptr) observer->after(pair.gemm, stream);
    mark_step_done(pair.gemm, m);
    return true;
  }

  mark_step_live(pair.gemm, m);
  mark_step_live(pair.collective, m);
  join_overlapping(pair.gemm, m, stream);
  join_overlapping(pair.collective, m, stream);
  if (observer != nullptr) observer->before(pair.gemm, stream);
  auto* out = static_cast<char*>(const_cast<void*>(pointer(collective.output)));
  PendingCollective pending{pair.collective, {}};
  for (int root : touched[m][c]) pending.ranges.push_back(range_of(root));
  for (std::size_t s = 0; s < schedule.stages.size(); ++s) {
    const OverlapStage& stage = schedule.stages[s];
    for (const GemmPiece& piece : stage.pieces)
      run_gemm_piece(pair.gemm, beside(desc), args, piece, a, stream);
    const bool last = s + 1 == schedule.stages.size();
    if (last && observer != nullptr) observer->after(pair.gemm, stream);
    OPFUSE_CUDA_CHECK(cudaEventRecord(side.stage(s), stream), "forking a pipelined collective");
    OPFUSE_CUDA_CHECK(cudaStreamWaitEvent(side.stream(), side.stage(s), 0),
                      "forking a pipelined collective");
    if (s == 0) pending_collectives.push_back(pending);  // later pieces leave it SMs
    if (last && observer != nullptr) observer->before(pair.collective, side.stream());
    // The elements this rank sends: the stage's rows (a reduce_scatter's of every rank).
    enqueue_collective(collective, d + stage.in_row * d_row, out + stage.out_row * d_row,
                       stage.in_rows * desc.n, side.stream());
    if (check_each_step()) synchronize_after(pair.collective, "NCCL's collective", side.stream());
  }
  if (observer != nullptr) observer->after(pair.collective, side.stream());
  OPFUSE_CUDA_CHECK(cudaEventRecord(side.done(c), side.stream()), "forking a collective");
  mark_step_done(pair.gemm, m);
  mark_step_done(pair.collective, m);
  return true;
}

void SequenceExecutor::Impl::run_gemm_piece(int index, const GemmDesc& desc, const GemmArgs& args,
                                            const GemmPiece& piece, const void* a_base,
                                            cudaStream_t stream) {
  GemmDesc piece_desc = desc;
  piece_desc.m = piece.rows;
  GemmArgs piece_args = args;
  piece_args.a =
      static_cast<const char*>(a_base) + piece.a_row * desc.k * plan::dtype_bytes(desc.a);
  piece_args.d = static_cast<char*>(args.d) + piece.d_row * desc.n * plan::dtype_bytes(desc.d);
  gemms.run(piece_desc, piece_args, stream);
  if (check_each_step())
    synchronize_after(index, fmt::format("cuBLASLt's {}", describe(piece_desc)), stream);
}

CollectiveStream::CollectiveStream(std::size_t steps) : ready_(steps), done_(steps) {
  int least = 0, greatest = 0;
  OPFUSE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "the collective stream");
  OPFUSE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
                    "the collective stream");
}

CollectiveStream::~CollectiveStream() {
  for (cudaEvent_t event : ready_)
    if (event != nullptr) (void)cudaEventDestroy(event);
  for (cudaEvent_t event : done_)
    if (event != nullptr) (void)cudaEventDestroy(event);
  for (cudaEvent_t event : stage_)
    if (event != nullptr) (void)cudaEventDestroy(event);
  (void)cudaStreamDestroy(stream_);
}

namespace {
cudaEvent_t made(cudaEvent_t& event) {
  if (event == nullptr) {
    OPFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                      "the collective stream's events");
  }
  return event;
}
}  // namespace

cudaEvent_t CollectiveStream::ready(std::size_t step) { return made(ready_.at(step)); }
cudaEvent_t CollectiveStream::done(std::size_t step) { return made(done_.at(step)); }
cudaEvent_t CollectiveStream::stage(std::size_t stage) {
  if (stage >= stage_.size()) stage_.resize(stage + 1, nullptr);
  return made(stage_[stage]);
}

void SequenceExecutor::Impl::synchronize_after(int index, std::string_view work,
                                               cudaStream_t stream) const {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  OPFUSE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), "OPFUSE_CHECK_EACH_STEP");
  if (capture != cudaStreamCaptureStatusNone) return;  // a recording runs later, as a whole
  const cudaError_t status = cudaStreamSynchronize(stream);
  if (status == cudaSuccess) return;
  const std::string& label = step_labels[static_cast<std::size_t>(index)];
  if (is_context_fault(status)) {
    report_context_fault(
        status, fmt::format("the synchronization after {}", label),
        fmt::format("This step faulted, in {}: OPFUSE_CHECK_EACH_STEP=1 synchronized after it "
                    "and after every earlier step of this stream without a fault.",
                    work));
  }
  check_cuda(status, "cudaStreamSynchronize(stream)", __FILE__, __LINE__,
             fmt::format("OPFUSE_CHECK_EACH_STEP after {}", label));
}

void SequenceExecutor::Impl::keep_cast_scale_inv(const WeightCacheGroup& group,
                                                 cudaStream_t stream) {
  if (cast_scale_inv.data() == nullptr) return;
  for (const int q : group.quantizers) {
    OPFUSE_CUDA_CHECK(cudaMemcpyAsync(cast_scale_inv_slot(q), quantizers->scale_inv(q),
                                      sizeof(float), cudaMemcpyDeviceToDevice, stream),
                      "keeping an FP8 weight's scale_inv");
  }
}

float* SequenceExecutor::Impl::cast_scale_inv_slot(int quantizer) const {
  return static_cast<float*>(cast_scale_inv.data()) + 4 * static_cast<std::size_t>(quantizer);
}

void SequenceExecutor::Impl::observed_step(int index, cudaStream_t stream) {
  // A launch with an empty grid (an inference variant that runs nothing) is not observed.
  const auto i = static_cast<std::size_t>(index);
  const BoundStep& bound_step =
      layout == RunMode::Inference && inference_steps[i] ? *inference_steps[i] : steps[i];
  const bool observe =
      observer != nullptr && !(std::holds_alternative<LaunchStep>(plan.steps[i].body) &&
                               (bound_step.skip || folded(index)));
  if (observe) observer->before(index, stream);
  run_step(index, stream);
  if (observe) observer->after(index, stream);
}

const void* SequenceExecutor::Impl::result(const std::map<std::string, int, std::less<>>& names,
                                           std::string_view name, bool computed,
                                           const char* kind) const {
  const auto found = names.find(name);
  if (found == names.end()) {
    std::vector<std::string> known;
    known.reserve(names.size());
    for (const auto& [known_name, id] : names) known.push_back(known_name);
    throw UsageError(fmt::format("sequence '{}' has no {} '{}': its {}s are [{}]", plan.name, kind,
                                 name, kind, fmt::join(known, ", ")));
  }
  const void* data = pointer(found->second);
  if (!computed || data == nullptr) {
    throw UsageError(fmt::format(
        "{} '{}' of sequence '{}' is not computed: results live from the forward (outputs) or "
        "backward (gradients) that makes them until the next forward() or backward()",
        kind, name, plan.name));
  }
  return data;
}

}  // namespace opfuse::gpu
