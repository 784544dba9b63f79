#include "collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <barrier>

#include "cpu_tensor.h"

namespace opfuse::cpu {

// Every rank posts its buffer, waits until all have, computes its result from all of them, and
// waits again before the next call may overwrite a posted buffer.
struct SimulatedGroup::Shared {
  explicit Shared(int n) : size(n), posted(size_t(n)), sync(n) {}
  int size;
  std::vector<std::span<const double>> posted;
  std::barrier<> sync;

  void barrier() { sync.arrive_and_wait(); }
};

class SimulatedGroup::Rank : public Collectives {
 public:
  Rank(Shared& shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_.size; }

  void all_reduce(std::span<double> values, ReduceKind op) override {
    const std::vector<double> mine(values.begin(), values.end());
    post(mine);
    for (size_t i = 0; i < values.size(); ++i) {
      double acc = shared_.posted[0][i];
      for (int r = 1; r < shared_.size; ++r) {
        const double v = shared_.posted[size_t(r)][i];
        acc = op == ReduceKind::Sum ? acc + v : std::max(acc, v);
      }
      values[i] = acc;
    }
    shared_.barrier();
  }

  std::vector<double> all_gather(std::span<const double> local) override {
    post(local);
    std::vector<double> out;
    out.reserve(local.size() * size_t(shared_.size));
    for (int r = 0; r < shared_.size; ++r)
      out.insert(out.end(), shared_.posted[size_t(r)].begin(), shared_.posted[size_t(r)].end());
    shared_.barrier();
    return out;
  }

 private:
  void post(std::span<const double> values) {
    shared_.posted[size_t(rank_)] = values;
    shared_.barrier();
    for (int r = 0; r < shared_.size; ++r) {
      if (shared_.posted[size_t(r)].size() != values.size())
        throw ReferenceError(fmt::format(
            "rank {} of the simulated group passes {} values to a collective, rank {} passes {}", r,
            shared_.posted[size_t(r)].size(), rank_, values.size()));
    }
  }

  Shared& shared_;
  int rank_;
};

SimulatedGroup::SimulatedGroup(int size) : shared_(std::make_unique<Shared>(size)) {
  if (size < 1) throw ReferenceError(fmt::format("a group needs at least one rank, not {}", size));
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(*shared_, r));
}

SimulatedGroup::~SimulatedGroup() = default;

int SimulatedGroup::size() const { return shared_->size; }

Collectives& SimulatedGroup::rank(int r) { return *ranks_.at(size_t(r)); }

}  // namespace opfuse::cpu
