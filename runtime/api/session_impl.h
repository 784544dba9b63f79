// Session's state (opfuse/program.h), shared by the files that implement Session:
// session.cpp and session_quantized.cpp (the quantized inputs and outputs).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "api/debug_session.h"
#include "api/program_impl.h"
#include "api/state_file.h"
#include "comm/communicator.h"
#include "gpu/binding_check.h"
#include "gpu/device_memory.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "opfuse/program.h"

namespace opfuse {

struct Session::Impl {
  std::shared_ptr<const Program::Impl> program;
  const plan::SequencePlan* plan = nullptr;
  cudaStream_t stream = nullptr;
  std::unique_ptr<gpu::PlanModules> modules;
  std::unique_ptr<gpu::GemmRunner> gemms;
  std::unique_ptr<comm::Communicator> communicator;       // tensor-parallel sequences
  std::unique_ptr<comm::Communicator> amax_communicator;  // SessionOptions::amax_group
  int rank = 0;                                           // this process's, of plan->parallel.tp
  std::unique_ptr<gpu::SequenceExecutor> executor;        // the plain plan's
  // With a debug config: the variants' executors and the iteration loop. exec() is the executor
  // of the variant that runs now.
  std::unique_ptr<api::DebugSession> debug;
  std::map<std::string, std::int64_t> bindings;
  bool bound = false;
  std::map<std::string, gpu::DeviceBuffer, std::less<>> owned;  // parameters we own
  std::map<std::string, const void*, std::less<>> given;        // set_tensor pointers
  // Quantized inputs last given without their column-wise copy: backward() refuses to run.
  std::set<std::string, std::less<>> without_columnwise;
  std::int64_t steps = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  cudaStream_t graph_stream = nullptr;
  Session::GraphScope graph_scope = Session::GraphScope::TrainingStep;

  ~Impl() { destroy_graph(); }

  void set_everywhere(const std::string& name, const void* pointer) {
    executor->set_tensor(name, pointer);
    if (debug) debug->set_tensor(name, pointer);
  }

  gpu::SequenceExecutor& exec() const { return debug ? debug->current() : *executor; }

  // Every quantizer's state by name (debug: the current variant's and the others' last).
  std::map<std::string, cpu::DelayedScalingState> quantizer_states(cudaStream_t stream) const {
    if (debug) return debug->quantizer_states(stream);
    std::map<std::string, cpu::DelayedScalingState> states;
    const std::vector<cpu::DelayedScalingState> list = executor->download_quantizers(stream);
    for (std::size_t i = 0; i < list.size(); ++i) states[plan->quantizers.at(i).name] = list[i];
    return states;
  }
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void destroy_graph() {
    // Why statuses are dropped: teardown must not throw.
    if (graph_exec != nullptr) (void)cudaGraphExecDestroy(graph_exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    graph_exec = nullptr;
    graph = nullptr;
  }

  void require_no_graph(const char* what) const {
    if (graph_exec != nullptr) {
      throw UsageError(fmt::format(
          "{} while sequence '{}' has a captured CUDA graph: replay() it, or release_graph() "
          "first to run eagerly",
          what, plan->name));
    }
  }

  void require_bound(const char* what) const {
    if (!bound) {
      throw UsageError(fmt::format("{} on sequence '{}' before bind(): bind the sizes ({}) first",
                                   what, plan->name, fmt::join(plan->symbols, ", ")));
    }
  }

  std::vector<gpu::TensorInfo> params() const {
    std::vector<gpu::TensorInfo> result;
    for (gpu::TensorInfo& info : exec().tensors())
      if (info.role == plan::BufferRole::Param) result.push_back(std::move(info));
    return result;
  }

  const void* param_pointer(const std::string& name) const {
    if (const auto it = given.find(name); it != given.end()) return it->second;
    if (const auto it = owned.find(name); it != owned.end()) return it->second.data();
    return nullptr;
  }

  // The layout a state file of this session has (bytes left empty).
  api::StateFile state_layout() const {
    std::map<std::string, std::vector<std::int64_t>, std::less<>> shapes;
    for (gpu::TensorInfo& info : params()) shapes.emplace(info.name, std::move(info.shape));
    return api::plan_state_layout(
        *plan, fmt::format("{}:{}", program->source_name, plan->name), rank,
        [&](const plan::Buffer& buffer) { return shapes.at(gpu::ir_name(buffer.name)); });
  }
};

}  // namespace opfuse
