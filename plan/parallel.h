// Tensor parallelism as the plan records it (docs/parallel.md): the group a sequence is split
// over, and how each parameter is cut into the ranks' shards, so checkpoints can be split and
// merged without the compiler.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace opfuse::plan {

// `with parallel(tp = N, sp = true|false)`: N ranks, one GPU each, share every layer; under
// sequence parallelism (sp) the tokens outside the tensor-parallel linears are split over them.
struct ParallelSpec {
  int tp = 1;
  bool sp = false;
  bool active() const { return tp > 1; }
  friend bool operator==(const ParallelSpec&, const ParallelSpec&) = default;
};

// How a parameter is cut over the ranks: not at all (dim < 0: every rank holds all of it), or
// along `dim` into tp equal shards, rank r holding shard r. `blocks` > 1 when the dimension is
// itself made of equal blocks that are each split (a column-parallel linear feeding a gated
// activation: its output features are [gate | value], and rank r holds the r-th part of the
// gate and the r-th part of the value, so the gated activation pairs them locally).
struct ShardSpec {
  int dim = -1;
  int blocks = 1;
  bool sharded() const { return dim >= 0; }
  friend bool operator==(const ShardSpec&, const ShardSpec&) = default;
};

// The index of element `i` of rank `rank`'s shard (of shape `shard_shape`, row-major) in the
// unsharded parameter, which is `shape` with shard_shape[dim] * tp along `dim`.
int64_t unsharded_index(const std::vector<int64_t>& shard_shape, const ShardSpec& spec, int tp,
                        int rank, int64_t i);

// Rank `rank`'s shard of an unsharded parameter `full` of shape `full_shape` (row-major), and the
// inverse: the unsharded parameter from every rank's shard in rank order. Throws
// std::invalid_argument when the sizes do not divide or disagree.
template <typename T>
std::vector<T> take_shard(std::span<const T> full, const std::vector<int64_t>& full_shape,
                          const ShardSpec& spec, int tp, int rank);
template <typename T>
std::vector<T> join_shards(const std::vector<std::span<const T>>& shards,
                           const std::vector<int64_t>& shard_shape, const ShardSpec& spec);
std::vector<int64_t> shard_shape(const std::vector<int64_t>& full_shape, const ShardSpec& spec,
                                 int tp);  // throws std::invalid_argument when it does not divide

}  // namespace opfuse::plan
