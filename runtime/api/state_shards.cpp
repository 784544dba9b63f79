// plan_state_layout, merge_state_shards and split_state_file (api/state_file.h): the layout of a
// rank's state file, every tensor-parallel rank's state file joined into the one-rank state, and a
// one-rank state cut into the ranks' files (docs/parallel.md, "Checkpoints"). Split from
// state_file.cpp, which reads and writes the files.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/state_file.h"
#include "gpu/binding_check.h"
#include "plan/enums.h"
#include "plan/parallel.h"

namespace opfuse::api {

namespace {

template <typename T>
std::vector<unsigned char> join_bytes(const std::vector<const StateTensor*>& parts) {
  std::vector<std::vector<T>> values;
  std::vector<std::span<const T>> spans;
  values.reserve(parts.size());
  spans.reserve(parts.size());
  for (const StateTensor* part : parts) {
    values.emplace_back(part->bytes.size() / sizeof(T));
    std::memcpy(values.back().data(), part->bytes.data(), part->bytes.size());
  }
  for (const std::vector<T>& v : values) spans.emplace_back(v);
  const std::vector<T> joined = plan::join_shards<T>(spans, parts[0]->shape, parts[0]->shard);
  std::vector<unsigned char> out(joined.size() * sizeof(T));
  std::memcpy(out.data(), joined.data(), out.size());
  return out;
}

template <typename T>
std::vector<unsigned char> shard_bytes(const StateTensor& whole, const plan::ShardSpec& spec,
                                       int tp, int rank) {
  std::vector<T> values(whole.bytes.size() / sizeof(T));
  std::memcpy(values.data(), whole.bytes.data(), whole.bytes.size());
  const std::vector<T> part = plan::take_shard<T>(values, whole.shape, spec, tp, rank);
  std::vector<unsigned char> out(part.size() * sizeof(T));
  std::memcpy(out.data(), part.data(), out.size());
  return out;
}

}  // namespace

StateFile plan_state_layout(
    const plan::SequencePlan& plan, const std::string& program, int rank,
    const std::function<std::vector<std::int64_t>(const plan::Buffer&)>& shape_of) {
  StateFile state;
  state.program = program;
  state.recipe = plan.recipe;
  state.tp = plan.parallel.tp;
  state.rank = rank;
  for (const plan::Buffer& buffer : plan.buffers) {
    if (buffer.role != plan::BufferRole::Param || buffer.alias_of >= 0) continue;
    // With its cut over the ranks (docs/parallel.md).
    state.tensors.push_back(
        {gpu::ir_name(buffer.name), buffer.dtype, shape_of(buffer), {}, buffer.shard});
  }
  for (const plan::QuantizerPlan& q : plan.quantizers) {
    StateQuantizer quantizer;
    quantizer.name = q.name;
    quantizer.state.amax_history.assign(static_cast<std::size_t>(q.spec.history_slots()), 0.0f);
    state.quantizers.push_back(std::move(quantizer));
  }
  return state;
}

std::vector<StateFile> split_state_file(const StateFile& whole, int tp,
                                        const std::map<std::string, plan::ShardSpec>& shards,
                                        const std::string& program) {
  if (tp < 2) throw UsageError(fmt::format("splitting a state file needs tp >= 2, got {}", tp));
  if (whole.tp != 1) {
    throw UsageError(fmt::format(
        "the state file holds rank {} of {} ranks' shards, not one rank's whole parameters: "
        "merge the ranks' files first (fusec merge-state)",
        whole.rank, whole.tp));
  }
  std::vector<std::string> problems;
  if (!whole.quantizers_only) {
    for (const auto& entry : shards) {
      const std::string& name = entry.first;
      if (std::none_of(whole.tensors.begin(), whole.tensors.end(),
                       [&](const StateTensor& t) { return t.name == name; }))
        problems.push_back(fmt::format("it lacks parameter '{}' of {}", name, program));
    }
  }
  for (const StateTensor& t : whole.tensors) {
    const auto found = shards.find(t.name);
    if (found == shards.end()) {
      problems.push_back(fmt::format("its tensor '{}' is not a parameter of {}", t.name, program));
      continue;
    }
    if (!found->second.sharded()) continue;
    try {
      (void)plan::shard_shape(t.shape, found->second, tp);
    } catch (const std::invalid_argument& e) {
      problems.push_back(fmt::format("'{}' cannot be cut over {} ranks: {}", t.name, tp, e.what()));
    }
  }
  if (!problems.empty()) {
    throw UsageError(fmt::format("the state file does not split into {}'s {} ranks: {}", program,
                                 tp, fmt::join(problems, "; ")));
  }
  std::vector<StateFile> ranks;
  for (int rank = 0; rank < tp; ++rank) {
    StateFile f;
    f.program = program;
    f.recipe = whole.recipe;
    f.step = whole.step;
    f.tp = tp;
    f.rank = rank;
    f.quantizers_only = whole.quantizers_only;
    f.quantizers = whole.quantizers;
    for (const StateTensor& t : whole.tensors) {
      const plan::ShardSpec& spec = shards.at(t.name);
      if (!spec.sharded()) {
        f.tensors.push_back(t);
        continue;
      }
      StateTensor part = t;
      part.shard = spec;
      part.shape = plan::shard_shape(t.shape, spec, tp);
      switch (plan::dtype_bytes(t.dtype)) {
        case 1:
          part.bytes = shard_bytes<std::uint8_t>(t, spec, tp, rank);
          break;
        case 2:
          part.bytes = shard_bytes<std::uint16_t>(t, spec, tp, rank);
          break;
        default:
          part.bytes = shard_bytes<float>(t, spec, tp, rank);
          break;
      }
      f.tensors.push_back(std::move(part));
    }
    ranks.push_back(std::move(f));
  }
  return ranks;
}

StateFile merge_state_shards(const std::vector<StateFile>& ranks, const std::string& program) {
  if (ranks.empty()) throw UsageError("merging shards needs every rank's state file, got none");
  const int tp = ranks[0].tp;
  if (tp < 2 || static_cast<int>(ranks.size()) != tp) {
    throw UsageError(fmt::format(
        "merging shards needs the files of all {} ranks of the run, got {}{}", tp, ranks.size(),
        tp < 2 ? " (the first file is not a tensor-parallel rank's)" : ""));
  }
  std::vector<const StateFile*> by_rank(static_cast<std::size_t>(tp), nullptr);
  for (const StateFile& f : ranks) {
    if (f.tp != tp || f.program != ranks[0].program || f.recipe != ranks[0].recipe ||
        f.step != ranks[0].step || f.quantizers_only != ranks[0].quantizers_only) {
      throw UsageError(fmt::format(
          "the state files are not of one run: rank {} of {} from '{}' (recipe '{}', step {}{}) "
          "next to rank {} of {} from '{}' (recipe '{}', step {}{})",
          f.rank, f.tp, f.program, f.recipe, f.step, f.quantizers_only ? ", quantizers only" : "",
          ranks[0].rank, tp, ranks[0].program, ranks[0].recipe, ranks[0].step,
          ranks[0].quantizers_only ? ", quantizers only" : ""));
    }
    const auto r = static_cast<std::size_t>(f.rank);
    if (by_rank[r] != nullptr) throw UsageError(fmt::format("rank {} is given twice", f.rank));
    by_rank[r] = &f;
  }
  StateFile out;
  const StateFile& first = *by_rank[0];
  out.quantizers_only = first.quantizers_only;
  out.program = program.empty() ? first.program : program;
  out.recipe = first.recipe;
  out.step = first.step;
  for (const StateTensor& t : first.tensors) {
    std::vector<const StateTensor*> parts;
    for (const StateFile* f : by_rank) {
      const auto it = std::find_if(f->tensors.begin(), f->tensors.end(),
                                   [&](const StateTensor& x) { return x.name == t.name; });
      if (it == f->tensors.end() || it->dtype != t.dtype || it->shape != t.shape ||
          it->shard != t.shard) {
        throw UsageError(
            fmt::format("tensor '{}' of rank {} does not match rank 0's", t.name, f->rank));
      }
      parts.push_back(&*it);
    }
    StateTensor whole = t;
    whole.shard = {};
    if (!t.shard.sharded()) {
      for (const StateTensor* part : parts) {
        if (part->bytes != t.bytes) {
          throw UsageError(fmt::format(
              "tensor '{}' is replicated but differs between rank 0 and another rank: the "
              "ranks did not train in step",
              t.name));
        }
      }
    } else {
      whole.shape[static_cast<std::size_t>(t.shard.dim)] *= tp;
      switch (plan::dtype_bytes(t.dtype)) {
        case 1:
          whole.bytes = join_bytes<std::uint8_t>(parts);
          break;
        case 2:
          whole.bytes = join_bytes<std::uint16_t>(parts);
          break;
        default:
          whole.bytes = join_bytes<float>(parts);
          break;
      }
    }
    out.tensors.push_back(std::move(whole));
  }
  for (const StateFile* f : by_rank) {
    if (f->tensors.size() != first.tensors.size() ||
        f->quantizers.size() != first.quantizers.size())
      throw UsageError(
          fmt::format("rank {}'s file has other tensors or quantizers than rank 0's", f->rank));
    for (std::size_t i = 0; i < first.quantizers.size(); ++i) {
      const StateQuantizer& a = first.quantizers[i];
      const StateQuantizer& b = f->quantizers[i];
      const auto& ha = a.state.amax_history;
      const auto& hb = b.state.amax_history;
      const bool same = a.name == b.name && a.state.scale == b.state.scale &&
                        a.state.scale_inv == b.state.scale_inv && ha.size() == hb.size() &&
                        std::equal(ha.begin() + 1, ha.end(), hb.begin() + 1);
      if (!same) {
        throw UsageError(fmt::format(
            "quantizer '{}' differs between rank 0 and rank {}: its amaxes were not reduced over "
            "the ranks",
            a.name, f->rank));
      }
    }
  }
  out.quantizers = first.quantizers;
  // Slot 0 holds the amax of a step in progress (saved between forward and step()), which each
  // rank measured over its share: the whole tensor's is the max, as step() would reduce it.
  for (std::size_t i = 0; i < out.quantizers.size(); ++i)
    for (const StateFile* f : by_rank)
      out.quantizers[i].state.amax_history[0] =
          std::max(out.quantizers[i].state.amax_history[0], f->quantizers[i].state.amax_history[0]);
  return out;
}

}  // namespace opfuse::api
