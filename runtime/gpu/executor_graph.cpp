// The automatic graph of small inference forwards (note "Automatic graphs" in
// plan_executor.cpp): graph_forward() decides whether a forward replays, records or runs
// eagerly; record_graph() captures one from the staging buffers; drop_graph() releases it.
#include "gpu/executor_impl.h"

namespace opfuse::gpu {

void SequenceExecutor::Impl::drop_graph() {
  // Why the status is dropped: this runs in destructors; the exec holds only its own resources.
  if (graph != nullptr) (void)cudaGraphExecDestroy(graph);
  graph = nullptr;
  graph_key.clear();
  graph_skips.clear();
  eager_run_seen = false;
}

// Note "Automatic graphs". Returns false when this forward must run eagerly.
bool SequenceExecutor::Impl::graph_forward(cudaStream_t stream) {
  if (!auto_graph || pinned || observer != nullptr || input_bytes > kAutoGraphInputBytes) {
    return false;
  }
  // Why: CUDA cannot record the legacy default stream (cudaStreamBeginCapture refuses it with
  // cudaErrorStreamCaptureUnsupported); forwards there run eagerly. An application's stream, or
  // torch's current stream inside a `torch.cuda.stream(...)` block, replays.
  if (stream == nullptr || stream == cudaStreamLegacy) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  OPFUSE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), "an inference forward");
  if (capture != cudaStreamCaptureStatusNone) return false;  // the application's own graph
  std::vector<const void*> key;
  key.reserve(keyed_roots.size());
  for (int root : keyed_roots) key.push_back(caller_pointers[static_cast<std::size_t>(root)]);
  std::vector<char> skips(cache_groups.size());
  for (std::size_t g = 0; g < cache_groups.size(); ++g)
    skips[g] = cache_valid(cache_groups[g]) ? 1 : 0;
  // Note "Fused GEMM epilogues": a recording holds an interleaving of B only if it was stale
  // then; a weight cast since (a training step) makes it stale again, so record anew.
  for (const FusedGemm& f : fused_gemms) skips.push_back(f.fresh(cache_groups) ? 1 : 0);
  const bool allocated = memory.size() >= needed_bytes[mode_index(RunMode::Inference)];
  if (graph == nullptr || key != graph_key || skips != graph_skips || !allocated) {
    const bool seen =
        eager_run_seen && graph == nullptr && key == graph_key && skips == graph_skips && allocated;
    drop_graph();
    graph_key = std::move(key);
    graph_skips = std::move(skips);
    // Why one eager run first: it makes the cuBLASLt plans and kernel attributes outside the
    // recording, and a forward run once with these parameters is not worth a recording.
    if (!seen) {
      eager_run_seen = true;
      return false;
    }
    record_graph(stream);
  }
  for (std::size_t i = 0; i < input_roots.size(); ++i) {
    const auto root = static_cast<std::size_t>(input_roots[i]);
    OPFUSE_CUDA_CHECK(cudaMemcpyAsync(staging[i].data(), caller_pointers[root], bytes[root],
                                      cudaMemcpyDeviceToDevice, stream),
                      "copying an input into the recorded inference forward");
  }
  OPFUSE_CUDA_CHECK(cudaGraphLaunch(graph, stream), "replaying the recorded inference forward");
  layout = RunMode::Inference;
  run_steps(0, first_backward, stream, RunMode::Inference, false);
  ++graph_replays;
  return true;
}

void SequenceExecutor::Impl::record_graph(cudaStream_t stream) {
  ensure_memory(needed_bytes[mode_index(RunMode::Inference)], stream);
  if (staging.size() != input_roots.size()) {
    staging.clear();
    for (int root : input_roots)
      staging.emplace_back(bytes[static_cast<std::size_t>(root)], stream);
  }
  layout = RunMode::Inference;
  // The recording reads the staging buffers where the caller's inputs would be.
  std::vector<const void*> callers_inputs;
  for (std::size_t i = 0; i < input_roots.size(); ++i) {
    const auto root = static_cast<std::size_t>(input_roots[i]);
    callers_inputs.push_back(caller_pointers[root]);
    caller_pointers[root] = staging[i].data();
  }
  const auto restore = [&] {
    for (std::size_t i = 0; i < input_roots.size(); ++i)
      caller_pointers[static_cast<std::size_t>(input_roots[i])] = callers_inputs[i];
  };
  // Why the weight cache is saved: recording marks its groups cast, which only the replay does.
  std::vector<WeightCacheGroup> cache_before = cache_groups;
  cudaGraph_t recorded = nullptr;
  OPFUSE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                    "recording an inference forward");
  try {
    run_steps(0, first_backward, stream, RunMode::Inference);
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &recorded);
    if (recorded != nullptr) (void)cudaGraphDestroy(recorded);
    restore();
    cache_groups = std::move(cache_before);
    throw;
  }
  restore();
  cache_groups = std::move(cache_before);
  mark_all_dead(true);
  OPFUSE_CUDA_CHECK(cudaStreamEndCapture(stream, &recorded), "recording an inference forward");
  const cudaError_t instantiated = cudaGraphInstantiate(&graph, recorded, 0);
  (void)cudaGraphDestroy(recorded);
  OPFUSE_CUDA_CHECK(instantiated, "instantiating the recorded inference forward");
}

}  // namespace opfuse::gpu
