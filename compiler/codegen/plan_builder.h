// Internal to codegen: the per-sequence plan builder (plan.cpp) and the group emitters that turn
// one IR op or fused group into steps (plan_groups.cpp; emit_groups.h lists them).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "codegen/plan.h"

namespace opfuse::codegen {

// One top-level IR op: a fused op with its parts, or a plain op as a group of one.
struct Group {
  const ir::Operation* op = nullptr;
  int index = 0;  // in Sequence::ops
  std::vector<const ir::Operation*> parts;
  std::string pattern;  // empty for a plain op

  // The first part whose kind is one of `kinds`; nullptr when none.
  const ir::Operation* find(std::initializer_list<ir::OpKind> kinds) const;
  bool only(std::initializer_list<ir::OpKind> kinds) const;  // every part is one of `kinds`
};

// How a forward kernel that writes a transposed FP8 copy runs without it (kWriteTranspose = false):
// the launch of its step's inference variant, whose shape the emitter knows (the norm kernel's
// transposing grid is not its plain one).
struct WithoutTranspose {
  std::string what;  // the variant's description, before " (inference: ...)"
  GridRule grid;
  int block_threads = 0;
  int dynamic_smem_bytes = 0;
  // A launch that writes no copy itself but exists for copies that another launch makes (NVFP4's
  // Hadamard amax, measured for the column-wise copy only): their buffers. The variant applies
  // where backward alone reads them, as if the launch wrote them.
  std::vector<int> serves = {};
};

class SequenceBuilder {
 public:
  SequenceBuilder(const ir::Sequence& seq, const CodegenOptions& options, Plan& plan);
  SequencePlan build();

  // ---- for the emitters ----
  const ir::Sequence& seq() const { return seq_; }
  const CodegenOptions& options() const { return options_; }
  const ir::Value& value(ir::ValueId id) const { return seq_.value(id); }
  // The buffer of a materialized value; a CodegenError at `at` when the value lives only inside
  // a fused group (a kernel would have to write it but cannot).
  int buffer(ir::ValueId id, const ir::Operation& at) const;
  bool is_materialized(ir::ValueId id) const { return buffer_of_.at(id) >= 0; }
  int existing_buffer(ir::ValueId id) const { return buffer_of_.at(id); }  // -1: none
  const Buffer& plan_buffer(int id) const { return out_.buffers.at(size_t(id)); }
  // True for the transposed FP8 copy a cast_fp8 makes.
  bool is_columnwise_copy(ir::ValueId id) const { return columnwise_.count(id) > 0; }
  // The FP32 S_enc buffer the caller gives with an NVFP4 quantized input's copy `id`; -1: none.
  int tensor_scale_buffer(ir::ValueId id) const {
    const auto it = tensor_scale_of_.find(id);
    return it == tensor_scale_of_.end() ? -1 : it->second;
  }
  int add_workspace(const std::string& name, ir::DType dtype, std::vector<SymExpr> shape);
  void make_alias(ir::ValueId view, ir::ValueId of);
  // Capture `slot` holds the tensor of `buffer`: its shape is the buffer's. Returns the shape.
  const std::vector<SymExpr>& set_capture_buffer(int slot, int buffer) {
    plan::CaptureSlot& c = out_.capture_slots.at(size_t(slot));
    c.shape = out_.buffers.at(size_t(buffer)).shape;
    return c.shape;
  }
  std::string location(SourceLoc loc) const;

  // Appends a launch of the kernel instantiating `template_name<args>` (registered in the plan's
  // kernel list, shared with every other launch of the same instantiation). A forward launch that
  // writes a transposed copy (y_t / dx_t) must say how it runs without it: build() turns that into
  // the step's inference variant where only backward reads the copy.
  void add_launch(const Group& g, const std::string& what, const std::string& template_name,
                  const std::vector<std::string>& args, GridRule grid, int block_threads,
                  int dynamic_smem_bytes, std::vector<ParamBinding> params,
                  std::optional<WithoutTranspose> without_transpose = std::nullopt);
  void add_gemm(const Group& g, const std::string& what, GemmStep gemm);
  void add_collective(const Group& g, const std::string& what, CollectiveStep collective);
  // Current scaling (note "Current scaling" in docs/codegen.md): the kernel producing `value`
  // measures its amax for `quantizer` and derives the scale, so that cast needs neither.
  void mark_amax_measured(ir::ValueId value, int quantizer) { measured_amax_[value] = quantizer; }
  // Plan pass "fold-current-amax": whether producers measure current-scaling amaxes.
  bool fold_current_amax() const { return fold_current_amax_; }
  // The quantizer whose amax the producer of `value` measured; -1: none.
  int measured_amax(ir::ValueId value) const {
    const auto it = measured_amax_.find(value);
    return it == measured_amax_.end() ? -1 : it->second;
  }

  [[noreturn]] void fail(const ir::Operation& op, const std::string& message,
                         const std::string& hint = {}) const;

 private:
  Step& add_step(const Group* g, const std::string& what);
  std::vector<OpRef> op_refs(const Group& g) const;
  std::vector<std::string> quantizer_names(const Group& g) const;
  void plan_buffers();
  void add_scale_grid(const ir::Value& v, bool transposed);
  // plan_boundaries.cpp (note "Quantized boundaries" in docs/architecture.md).
  void add_boundary_scales(const ir::Value& v, int data, bool block_scaled);
  int add_boundary_input(const std::string& name);
  void tag_quantized_output();
  void plan_quantizers();
  void add_scale_update();
  void find_weight_cache_groups();
  void add_inference_variants();
  void add_gated_epilogues();  // plan_epilogues.cpp
  std::optional<GatedEpilogue> match_gated_epilogue(const GemmStep& gemm, const Step& act,
                                                    const LaunchStep* launch, bool training) const;
  void compute_lifetimes();

  const ir::Sequence& seq_;
  const CodegenOptions& options_;
  Plan& plan_;
  SequencePlan out_;
  std::vector<int> buffer_of_;  // per ValueId; -1: not materialized
  std::set<ir::ValueId> columnwise_;
  std::map<int, KernelUse> inference_uses_;     // per step with a candidate inference variant
  std::map<int, std::vector<int>> serves_;      // per step: WithoutTranspose::serves
  std::map<ir::ValueId, int> measured_amax_;    // value -> quantizer (mark_amax_measured)
  std::map<ir::ValueId, int> tensor_scale_of_;  // an NVFP4 quantized input's copy -> its S_enc
  bool fold_current_amax_ = true;
};

// Turns one group into steps (plan_groups.cpp); throws CodegenError when no kernel fits.
void emit_group(SequenceBuilder& b, const Group& g);

// The plan's kernel for `template_name<args>`, added on first use: one kernel per instantiation,
// shared by every launch of it (plan.cpp).
Kernel& kernel_for(Plan& plan, const std::string& template_name,
                   const std::vector<std::string>& args);
// The pointer to a column-wise FP8 copy (templates/README.md: y_t, dx_t), bound to a buffer.
bool binds_transposed_copy(const ParamBinding& p);

// ParamBinding constructors for the emitters.
ParamBinding bind_null(std::string field);
ParamBinding bind_in(std::string field, int buffer);   // a buffer the kernel reads
ParamBinding bind_out(std::string field, int buffer);  // a buffer the kernel writes
ParamBinding bind_buffers(std::string field, std::vector<int> buffers, bool written);
// The column-wise copy of a quantizer (y_t, dx_t): an output an inference forward may drop.
ParamBinding bind_copy(std::string field, int buffer);
ParamBinding bind_quantizer(std::string field, int quantizer, QuantizerValue value);
ParamBinding bind_records(std::string field, std::vector<int> quantizers);
ParamBinding bind_int(std::string field, SymExpr value);
// The executor's statistics record of `slot` (SequencePlan::stat_slots).
ParamBinding bind_stat_record(std::string field, int slot);
// The executor's float32 capture of `slot` (SequencePlan::capture_slots).
ParamBinding bind_capture(std::string field, int slot);
ParamBinding bind_int64(std::string field, SymExpr value);
ParamBinding bind_float(std::string field, double value);

}  // namespace opfuse::codegen
