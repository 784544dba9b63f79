// The collectives of a tensor-parallel sequence in the CPU reference (docs/parallel.md): a
// group of simulated ranks in one process, one thread each, that meet at every collective. The
// reductions are exact and the same on every rank (the ranks' values are summed in rank order in
// double), so a sharded run differs from the unsharded one only by the order of its sums.
#pragma once

#include <memory>
#include <span>
#include <vector>

namespace opfuse::cpu {

enum class ReduceKind { Sum, Max };

// One rank's view of its group. Every rank must make the same calls in the same order (as the
// executors of one program do); each call returns once every rank has made it.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: the element-wise sum (or max) over the ranks. Every rank passes as many values.
  virtual void all_reduce(std::span<double> values, ReduceKind op) = 0;
  // The ranks' `local` values (as many on each) concatenated in rank order.
  virtual std::vector<double> all_gather(std::span<const double> local) = 0;
};

// `size` simulated ranks: rank(r) is the r-th rank's Collectives, for the thread running it.
class SimulatedGroup {
 public:
  explicit SimulatedGroup(int size);
  ~SimulatedGroup();
  SimulatedGroup(const SimulatedGroup&) = delete;
  SimulatedGroup& operator=(const SimulatedGroup&) = delete;

  int size() const;
  Collectives& rank(int r);

 private:
  struct Shared;
  class Rank;
  std::unique_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace opfuse::cpu
