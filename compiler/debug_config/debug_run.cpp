#include "debug_config/debug_run.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace opfuse::debug {

bool written_by(std::string_view tensor, RunPhase phase) {
  if (phase == RunPhase::Both) return true;
  const bool forward = tensor == "activation" || tensor == "weight" || tensor == "output";
  return forward == (phase == RunPhase::Forward);
}

DebugRun::DebugRun(DebugRunSetup setup)
    : setup_(std::move(setup)), iteration_(setup_.start_iteration), current_(iteration_) {
  if (dumps_tensors(setup_.bindings)) {
    if (setup_.log_dir.empty())
      throw DebugLogError("DumpTensors needs a log directory to write to (--debug-log-dir)");
    check_dump_dir(setup_.log_dir, setup_.rank);
  }
}

const Routing& DebugRun::routing() {
  if (!routing_ || iteration_ >= routing_->next_change) {
    routing_ = route(setup_.bindings, iteration_);
    ++generation_;
    if (!routing_->conflicts.empty()) throw std::runtime_error(routing_->conflicts.front());
    const std::string key = routing_->variant_key();
    if (key != logged_key_ && setup_.log) {
      // TE's debug log has each layer's plan; ours has it whenever the variant changes.
      logged_key_ = key;
      setup_.log->debug_line(
          fmt::format("iteration {}: plan variant{}", iteration_, key.empty() ? " plain" : ""));
      if (setup_.sources) {
        for (const LayerRouting& l : routing_->layers) {
          std::string text = describe(l, *setup_.sources);
          while (!text.empty() && text.back() == '\n') text.pop_back();
          setup_.log->debug_line(text);
        }
      }
    }
  }
  routing_->iteration = iteration_;
  return *routing_;
}

void DebugRun::add_run(std::span<const plan::StatSlot> slots,
                       std::span<const TensorMoments> records, RunPhase phase) {
  current_.add_run(slots, records, phase);
}

void DebugRun::add_captures(std::span<const plan::CaptureSlot> slots,
                            std::span<const CapturedTensor> captures, RunPhase phase) {
  current_.add_captures(slots, captures, phase);
}

void IterationRecords::add_run(std::span<const plan::StatSlot> slots,
                               std::span<const TensorMoments> records, RunPhase phase) {
  std::vector<plan::StatSlot> taken_slots;
  std::vector<TensorMoments> taken;
  for (const plan::StatSlot& slot : slots) {
    const std::pair<std::string, std::string> tensor{slot.layer, slot.tensor};
    if (std::find(order_.begin(), order_.end(), tensor) == order_.end()) order_.push_back(tensor);
  }
  for (size_t i = 0; i < slots.size() && i < records.size(); ++i) {
    if (!written_by(slots[i].tensor, phase)) continue;
    taken_slots.push_back(slots[i]);
    taken.push_back(records[i]);
  }
  stats_.add_run(taken_slots, taken);
}

void IterationRecords::add_captures(std::span<const plan::CaptureSlot> slots,
                                    std::span<const CapturedTensor> captures, RunPhase phase) {
  std::vector<plan::CaptureSlot> taken_slots;
  std::vector<CapturedTensor> taken;
  for (size_t i = 0; i < slots.size() && i < captures.size(); ++i) {
    const std::pair<std::string, std::string> tensor{slots[i].layer, slots[i].tensor};
    if (std::find(order_.begin(), order_.end(), tensor) == order_.end()) order_.push_back(tensor);
    if (!written_by(slots[i].tensor, phase)) continue;
    taken_slots.push_back(slots[i]);
    taken.push_back(captures[i]);
  }
  if (phase == RunPhase::Backward) {
    captures_.add_to_last_run(taken_slots, taken);
  } else {
    captures_.add_run(taken_slots, taken);
  }
}

void DebugRun::end_step() {
  IterationRecords closed = close_iteration();
  write(closed);
}

IterationRecords DebugRun::close_iteration() {
  IterationRecords closed = std::move(current_);
  // The routing its runs had (asked by their variant()); asked here only when it has records.
  const bool asked = routing_ && iteration_ < routing_->next_change;
  if (asked || !closed.stats_.empty() || !closed.captures_.empty()) closed.routing_ = routing();
  ++iteration_;
  current_ = IterationRecords(iteration_);
  return closed;
}

void DebugRun::write(IterationRecords& closed) {
  // Statistics that came after the close need the routing too (a closed iteration without any
  // at its close takes its own iteration's routing, asked again).
  if (!closed.routing_ && (!closed.stats_.empty() || !closed.captures_.empty()))
    closed.routing_ = route(setup_.bindings, closed.iteration_);
  if (closed.routing_) {
    const Routing& routing = *closed.routing_;
    std::vector<StatRecord> records = closed.stats_.records(routing, closed.iteration_);
    for (StatRecord& r :
         closed.captures_.finish(routing, closed.iteration_, setup_.log_dir, setup_.rank))
      records.push_back(std::move(r));
    const auto& order = closed.order_;
    const auto rank = [&order](const StatRecord& r) {
      return std::find(order.begin(), order.end(), std::make_pair(r.layer, r.tensor)) -
             order.begin();
    };
    std::stable_sort(
        records.begin(), records.end(),
        [&rank](const StatRecord& a, const StatRecord& b) { return rank(a) < rank(b); });
    for (const StatRecord& r : records) {
      if (setup_.log) setup_.log->add(r);
      if (setup_.on_stat) setup_.on_stat(r);
    }
  }
  closed = IterationRecords(closed.iteration_);
  if (setup_.log) setup_.log->end_step();
}

}  // namespace opfuse::debug
