#include "plan/parallel.h"

#include <fmt/format.h>

#include <stdexcept>

namespace opfuse::plan {

namespace {

void check_spec(const std::vector<int64_t>& shape, const ShardSpec& spec) {
  if (!spec.sharded() || size_t(spec.dim) >= shape.size() || spec.blocks < 1)
    throw std::invalid_argument(
        fmt::format("shard(dim = {}, blocks = {}) does not fit a "
                    "parameter of rank {}",
                    spec.dim, spec.blocks, shape.size()));
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::vector<int64_t> shard_shape(const std::vector<int64_t>& full_shape, const ShardSpec& spec,
                                 int tp) {
  check_spec(full_shape, spec);
  const int64_t d = full_shape[size_t(spec.dim)];
  if (tp < 1 || d % (int64_t(tp) * spec.blocks) != 0)
    throw std::invalid_argument(
        fmt::format("dimension {} of size {} does not split into {} ranks "
                    "x {} blocks",
                    spec.dim, d, tp, spec.blocks));
  std::vector<int64_t> out = full_shape;
  out[size_t(spec.dim)] = d / tp;
  return out;
}

int64_t unsharded_index(const std::vector<int64_t>& shard_shape, const ShardSpec& spec, int tp,
                        int rank, int64_t i) {
  // Split i into (outer, along, inner) around `dim`.
  int64_t inner = 1;
  for (size_t k = size_t(spec.dim) + 1; k < shard_shape.size(); ++k) inner *= shard_shape[k];
  const int64_t local = shard_shape[size_t(spec.dim)];
  const int64_t along = (i / inner) % local;
  const int64_t outer = i / (inner * local);
  // The shard's `local` entries along dim are `blocks` runs of local / blocks, the run of block b
  // sitting at block b's rank-th part in the unsharded dimension.
  const int64_t part = local / spec.blocks;
  const int64_t block = along / part;
  const int64_t full_block = part * tp;
  const int64_t full_along = block * full_block + int64_t(rank) * part + along % part;
  return (outer * local * tp + full_along) * inner + i % inner;
}

template <typename T>
std::vector<T> take_shard(std::span<const T> full, const std::vector<int64_t>& full_shape,
                          const ShardSpec& spec, int tp, int rank) {
  const std::vector<int64_t> shape = shard_shape(full_shape, spec, tp);
  if (int64_t(full.size()) != numel(full_shape))
    throw std::invalid_argument(
        fmt::format("{} values for a parameter of {}", full.size(), numel(full_shape)));
  std::vector<T> out(size_t(numel(shape)));
  for (int64_t i = 0; i < int64_t(out.size()); ++i)
    out[size_t(i)] = full[size_t(unsharded_index(shape, spec, tp, rank, i))];
  return out;
}

template <typename T>
std::vector<T> join_shards(const std::vector<std::span<const T>>& shards,
                           const std::vector<int64_t>& shard_shape, const ShardSpec& spec) {
  check_spec(shard_shape, spec);
  const int tp = int(shards.size());
  const int64_t n = numel(shard_shape);
  if (shard_shape[size_t(spec.dim)] % spec.blocks != 0)
    throw std::invalid_argument("a shard's dimension does not split into its blocks");
  std::vector<T> out(size_t(n) * shards.size());
  for (int r = 0; r < tp; ++r) {
    if (int64_t(shards[size_t(r)].size()) != n)
      throw std::invalid_argument(
          fmt::format("shard {} has {} values, not {}", r, shards[size_t(r)].size(), n));
    for (int64_t i = 0; i < n; ++i)
      out[size_t(unsharded_index(shard_shape, spec, tp, r, i))] = shards[size_t(r)][size_t(i)];
  }
  return out;
}

template std::vector<float> take_shard(std::span<const float>, const std::vector<int64_t>&,
                                       const ShardSpec&, int, int);
template std::vector<double> take_shard(std::span<const double>, const std::vector<int64_t>&,
                                        const ShardSpec&, int, int);
template std::vector<uint16_t> take_shard(std::span<const uint16_t>, const std::vector<int64_t>&,
                                          const ShardSpec&, int, int);
template std::vector<uint8_t> take_shard(std::span<const uint8_t>, const std::vector<int64_t>&,
                                         const ShardSpec&, int, int);
template std::vector<float> join_shards(const std::vector<std::span<const float>>&,
                                        const std::vector<int64_t>&, const ShardSpec&);
template std::vector<double> join_shards(const std::vector<std::span<const double>>&,
                                         const std::vector<int64_t>&, const ShardSpec&);
template std::vector<uint16_t> join_shards(const std::vector<std::span<const uint16_t>>&,
                                           const std::vector<int64_t>&, const ShardSpec&);
template std::vector<uint8_t> join_shards(const std::vector<std::span<const uint8_t>>&,
                                          const std::vector<int64_t>&, const ShardSpec&);

}  // namespace opfuse::plan
