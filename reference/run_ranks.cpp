#include "run_ranks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <span>
#include <thread>
#include <vector>

#include "collectives.h"
#include "plan/parallel.h"
#include "reference_kernels.h"
#include "run_steps.h"

namespace opfuse::cpu {

namespace {

// Runs fn(r) for every rank r on a thread of its own, since every collective waits for all the
// ranks, and rethrows the lowest rank's error. The executors' user errors (bindings, shapes) come
// at construction, before any thread: an error one rank met alone would leave the others waiting
// in their next collective.
template <typename Fn>
void on_every_rank(int tp, const Fn& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&fn, &errors, r] {
      try {
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

// The dimension of `value` that the ranks split into tp equal shares (`tokens / tp`: rank r holds
// share r), or -1 when every rank holds the whole tensor.
int split_dim(const ir::Sequence& s, ir::ValueId value) {
  const ir::Value& v = s.value(value);
  for (size_t d = 0; d < v.type.shape.size(); ++d) {
    const ir::Dim& dim = v.type.shape[d];
    if (!dim.is_symbolic() || dim.divisor == 1) continue;
    if (dim.divisor != s.parallel.tp)
      throw ReferenceError(fmt::format(
          "'{}' of sequence '{}' is {}: the ranks of tp = {} cannot each take one share of it",
          v.name, s.name, ir::type_string(v.type), s.parallel.tp));
    return int(d);
  }
  return -1;
}

// The whole tensor from every rank's part of it (in rank order), cut as `spec` says; the one
// every rank holds when it is not cut.
std::vector<float> whole(const std::vector<std::span<const float>>& parts,
                         const std::vector<int64_t>& part_shape, const plan::ShardSpec& spec) {
  if (!spec.sharded()) return {parts.at(0).begin(), parts.at(0).end()};
  return plan::join_shards<float>(parts, part_shape, spec);
}

// Every rank's share of the unsharded program's inputs, drawn from the same seeded streams:
// inputs[r][i] is rank r's part of input i (rows [r * n / tp, (r + 1) * n / tp) of a token-split
// one, all of a replicated one).
std::vector<std::vector<Tensor<float>>> rank_inputs(const ReferenceExecutor<float>& rank0,
                                                    uint64_t seed) {
  const ir::Sequence& s = rank0.sequence();
  const int tp = s.parallel.tp;
  std::vector<std::vector<Tensor<float>>> inputs(static_cast<size_t>(tp));
  const std::vector<std::vector<int64_t>> shapes = rank0.input_shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const plan::ShardSpec cut{split_dim(s, s.inputs.at(i)), 1};
    std::vector<int64_t> whole_shape = shapes[i];
    if (cut.sharded()) whole_shape[size_t(cut.dim)] *= tp;
    Tensor<float> all = seeded_input(whole_shape, seed, i);
    round_as_stored(all.data, s.value(s.inputs.at(i)).type.dtype);
    for (int r = 0; r < tp; ++r) {
      inputs[size_t(r)].push_back(
          cut.sharded()
              ? Tensor<float>{shapes[i], plan::take_shard<float>(all.data, whole_shape, cut, tp, r)}
              : all);
    }
  }
  return inputs;
}

}  // namespace

std::string run_reference_ranks(const ir::Sequence& sequence, const RunOptions& options) {
  if (options.debug)
    throw ReferenceError(fmt::format(
        "sequence '{}' is tensor-parallel: a precision-debug config does not run over several "
        "ranks yet; run the config on the one-rank program",
        sequence.name));
  const int tp = sequence.parallel.tp;
  SimulatedGroup group(tp);
  const ir::Sequence lowered = lowered_for_run(sequence, nullptr);
  std::vector<ReferenceExecutor<float>> ranks;
  ranks.reserve(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    ReferenceOptions o;
    o.group = &group.rank(r);
    ranks.emplace_back(lowered, options.bindings, o);
  }
  const ir::Sequence& s = ranks[0].sequence();
  // How each parameter (executor order) and the main output lie over the ranks.
  std::vector<plan::ShardSpec> param_cuts;
  for (ir::ValueId p : s.params) param_cuts.push_back(s.value(p).shard);
  const plan::ShardSpec output_cut{split_dim(s, s.outputs.at(0).value), 1};

  const std::vector<std::vector<Tensor<float>>> inputs = rank_inputs(ranks[0], options.seed);
  on_every_rank(tp, [&](int r) { init_params_from_seed(ranks[size_t(r)], options.seed, r); });

  std::string out = format_run_header(sequence, options);
  std::vector<std::vector<Tensor<float>>> outputs(static_cast<size_t>(tp));
  std::vector<Gradients<float>> grads(static_cast<size_t>(tp));
  for (int step = 0; step < options.steps; ++step) {
    on_every_rank(tp,
                  [&](int r) { outputs[size_t(r)] = ranks[size_t(r)].forward(inputs[size_t(r)]); });
    std::vector<std::span<const float>> parts;
    parts.reserve(outputs.size());
    for (const auto& o : outputs) parts.emplace_back(o.at(0).data);
    const std::vector<float> y = whole(parts, outputs[0].at(0).shape, output_cut);
    StepReport report;
    report.sum_squares = squared_norm(y);
    report.numel = int64_t(y.size());
    // dL/dy of the whole output, each rank seeded with its part of it.
    on_every_rank(tp, [&](int r) {
      std::vector<Tensor<float>> seeds(outputs[size_t(r)].size());
      seeds[0] = outputs[size_t(r)][0];
      for (float& g : seeds[0].data) g = float(double(g) / double(report.numel));
      grads[size_t(r)] = ranks[size_t(r)].backward(seeds);
    });

    const std::vector<std::string>& names = ranks[0].param_names();
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<std::span<const float>> shards;
      shards.reserve(grads.size());
      for (const Gradients<float>& g : grads) shards.emplace_back(g.params.at(i).data);
      const std::vector<float> g = whole(shards, grads[0].params[i].shape, param_cuts.at(i));
      report.grad_norms.emplace_back(names[i], std::sqrt(squared_norm(g)));
    }
    // The amax of the step is the max over the ranks (before step() reduces it under delayed
    // scaling); the scales agree, each derived from reduced amaxes.
    report.quantizers = ranks[0].quantizers();
    for (int r = 1; r < tp; ++r) {
      const std::vector<QuantizerInfo> theirs = ranks[size_t(r)].quantizers();
      for (size_t q = 0; q < theirs.size(); ++q)
        report.quantizers[q].amax_history.at(0) =
            std::max(report.quantizers[q].amax_history.at(0), theirs[q].amax_history.at(0));
    }
    out += format_step(step, report);
    on_every_rank(tp, [&](int r) {
      ranks[size_t(r)].step();
      ranks[size_t(r)].sgd_step(grads[size_t(r)], options.lr);
    });
  }
  return out;
}

}  // namespace opfuse::cpu
