// Internal to codegen: the group emitters that plan_groups.cpp (the dispatch, emit_group, and the
// helpers below), emit_elementwise.cpp (cast, norm, activation, bias, scale and quantize kernels)
// and emit_gemms.cpp (fprop, dgrad and wgrad GEMMs) define between them. Note "Kernels by parts"
// and note "Current scaling" are in docs/codegen.md.
#pragma once

#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../../templates/common/launch_rules.h"
#include "codegen/plan_builder.h"
#include "ir/pointwise_ops.h"

namespace opfuse::codegen::emitters {

namespace rules = opfuse::launch;
using ir::DType;
using ir::OpKind;
using ir::ValueId;

// ---- shared helpers (plan_groups.cpp) -----------------------------------------------------------

// Pointwise ops are selected by what they are (ir::is_pointwise...), never by a list of kinds,
// so a new one needs nothing here.
const ir::Operation* find_part(const Group& g, bool (*is)(OpKind));

std::string spell(DType d);

std::string spell(bool b);

std::string_view name_of(DType d);

std::string_view name_of(OpKind k);

SymExpr rows_of(const ir::Value& v);

// The known last dimension of `v` (the width every template is specialized or checked on).
int64_t width_of(const SequenceBuilder& b, const ir::Operation& at, const ir::Value& v);

// Tiled and norm kernels move 16-byte vectors: a row must be a whole number of them.
void require_vector_width(const SequenceBuilder& b, const ir::Operation& at, int64_t width,
                          DType input, std::string_view kernel);

// Whether quantizer `q` derives its scale from this tensor's amax before the cast (its spec, not
// the sequence's recipe: an override may make one tensor current-scaled under delayed scaling).
bool current_scaling(const SequenceBuilder& b, int q);

DType quantizer_format(const SequenceBuilder& b, const ir::Operation& cast);

// The cast's row-wise and transposed results (-1 where it does not make them).
struct CastOutputs {
  int rowwise = -1;
  int columnwise = -1;
};

CastOutputs cast_outputs(const SequenceBuilder& b, const ir::Operation& cast);

std::string fp8_output_text(DType out, bool transposed);

// Known rows take the launch rule itself; symbolic rows spell its formula for run time (rows are
// never 0 there, so the rule's max with 1 is left out).
SymExpr tile_grid_y(const SymExpr& rows);

GridRule tile_grid(const SymExpr& rows, int64_t cols);

// A value a GEMM epilogue writes: its buffer, or scratch when no one outside the group reads it.
int epilogue_output(SequenceBuilder& b, ValueId v, const std::string& what);

[[noreturn]] void no_kernel(const SequenceBuilder& b, const Group& g);

void require_only(const SequenceBuilder& b, const Group& g, std::initializer_list<OpKind> kinds);

// Every part is a kind `is` accepts or one of `others`.
void require_only(const SequenceBuilder& b, const Group& g, bool (*is)(OpKind),
                  std::initializer_list<OpKind> others);

// reduce_column_partials: the fixed-order second stage of every dbias/dgamma/dbeta sum.
void emit_column_reduce(SequenceBuilder& b, const Group& g, const std::string& what,
                        std::vector<int> partials, std::vector<int> outputs,
                        const SymExpr& num_partials, int64_t cols, DType out);

// The scale_record field: the quantizer whose scale the kernel's last block derives, or null.
ParamBinding bind_scale_record(int quantizer);

// The amax field of a kernel that casts to FP8 itself under delayed scaling (`folded`: history
// slot 0), or measures a current-scaling amax (`measured`: the running max its scale_record's
// last block takes); null for neither.
ParamBinding bind_amax(int folded, int measured);

// Current scaling (note "Current scaling" in docs/codegen.md): before the cast (cast_fp8 or
// quantize: `cast`) of `x`, the amax of the whole of x and the scale derived from it, unless the
// kernel that produced x measured them (measure_for_cast); the cast itself then tracks no amax.
void emit_current_amax(SequenceBuilder& b, const Group& g, const ir::Operation& cast, ValueId x,
                       int quantizer);

// Current scaling: when `produced` (which this group's kernel writes whole, in high precision) is
// the input of an unfused cast_fp8 or quantize of the same phase, the kernel measures the amax
// for that cast's quantizer and its last block derives the scale (note "Current scaling"). Returns
// the quantizer; -1 when there is no such cast.
int measure_for_cast(SequenceBuilder& b, const Group& g, ValueId produced);

// A cast folded into a producing kernel: only under delayed scaling (its amax is this step's
// history slot 0); the producer's own result must not be needed in high precision too.
int folded_cast_quantizer(const SequenceBuilder& b, const Group& g, const ir::Operation& cast,
                          ValueId produced);

// What a kernel producing `produced` writes: with a folded cast, the cast's FP8 copies, its
// quantizer and format; without one, `produced` itself (the buffer `producer` writes) in its own
// dtype, quantizer -1.
struct KernelOutputs {
  int quantizer = -1;
  DType dtype = DType::BF16;
  CastOutputs copies;
};
KernelOutputs kernel_outputs(SequenceBuilder& b, const Group& g, const ir::Operation* cast,
                             ValueId produced, const ir::Operation& producer);

// ---- elementwise and normalization kernels (emit_elementwise.cpp)
// --------------------------------

void emit_cast(SequenceBuilder& b, const Group& g);
void emit_fp8_transpose(SequenceBuilder& b, const Group& g);
void emit_emulated_cast(SequenceBuilder& b, const Group& g);
// MXFP8 / NVFP4 (emit_micro_casts.cpp): a copy decoded to y, or stored as `codes` (a quantized
// output's), and a quantized input's copy decoded.
void emit_micro_cast(SequenceBuilder& b, const Group& g, const ir::Operation& op, ir::ValueId x,
                     int y, bool columnwise, bool columnwise_copy, int codes = -1);
void emit_micro_decode(SequenceBuilder& b, const Group& g, const ir::Operation& op,
                       bool columnwise);
// float8_block_scaling's casts (emit_block_casts.cpp): a block cast of its own, and one folded
// into the activation that produces its source (`dbias`: the backward's bias gradient, or null).
void emit_block_cast(SequenceBuilder& b, const Group& g, const ir::Operation& cast);
void emit_block_activation(SequenceBuilder& b, const Group& g, const ir::Operation& act,
                           const ir::Operation& cast, const ir::Operation* dbias);
// A norm whose output only feeds a 1 x 128 block cast (pattern norm_block_cast): the norm kernel
// writes the row-wise copy; in training a column-wise block cast reads its 16-bit output.
void emit_norm_block_cast(SequenceBuilder& b, const Group& g, const ir::Operation& norm,
                          const ir::Operation& cast);
// A norm whose output's MXFP8 row-wise copy is emulated (pattern norm_micro_cast): the norm kernel
// writes the decoded copy, and its output where another op reads it.
void emit_norm_micro_cast(SequenceBuilder& b, const Group& g, const ir::Operation& norm,
                          const ir::Operation& cast);
// The kFormat of micro_scale_cast and the kernels that write micro-scaled copies
// (launch::kMicroScaleE4M3 / E5M2 / E2M1) for a quantizer's format.
int micro_format(DType format);
// The conditions of the MXFP8 producer patterns (mxfp8_rowwise_decoded in
// compiler/passes/fusion/engine.cpp) as the emitters check them again: `cast` makes the decoded
// row-wise MXFP8 copy of `source`, both of `dtype`, rows `width` wide holding whole 1 x 32 blocks.
bool decoded_mxfp8_rows(const SequenceBuilder& b, const ir::Operation& cast, ValueId source,
                        DType dtype, int64_t width);
// An activation whose output's MXFP8 row-wise copy is emulated (pattern activation_micro_cast):
// the activation kernel writes the decoded copy, and its output where another op reads it.
void emit_activation_micro_cast(SequenceBuilder& b, const Group& g, const ir::Operation& act,
                                const ir::Operation& cast);
// Its backward's (pattern dact_micro_cast): the decoded copy of the gradient, and the gradient
// where another op reads it.
void emit_dact_micro_cast(SequenceBuilder& b, const Group& g, const ir::Operation& act,
                          const ir::Operation& cast);
// Note "Emulated block scaling" (docs/architecture.md): one Float8 block-scaled copy of x
// quantized and decoded to y (x's dtype and layout); `columnwise`: 128 x 1 blocks (128 x 128 for
// 2-D specs either way), a copy only backward reads (emit_emulated_blocks.cpp).
void emit_emulated_block_cast(SequenceBuilder& b, const Group& g, const ir::Operation& op,
                              ir::ValueId x, int y, bool columnwise);

// ---- statistics of a debug config (emit_stats.cpp) ----------------------------------------------

void emit_tensor_stats(SequenceBuilder& b, const Group& g);
void emit_tensor_capture(SequenceBuilder& b, const Group& g);
void emit_collective(SequenceBuilder& b, const Group& g);  // emit_collective.cpp

// Statistics a tiled kernel computes of its first input and of the value it produces: the group's
// TensorStats parts (folded by the fusion passes, passes/fusion/fold_stats.cpp). Each gets one
// partial record per block of the kernel's grid (templates/common/elementwise_tile.cuh, kStats);
// `tile` is the grid without statistics.
struct FusedStats {
  struct Tap {
    int slot = -1;         // the record's slot (Sequence::inspections); -1: none
    int partials = -1;     // its workspace of partial records, one per block
    std::string instance;  // the statistics op
  };
  Tap input, output;
  // The kernel's grid: the tile grid without statistics. With them (templates/common/
  // elementwise_tile.cuh), one wave of the GPU's resident blocks, each taking an equal run of the
  // tiles (no partial last wave, few partial records), or with dbias (whose column sums fix a
  // block's columns) fewer row blocks each taking several strided row tiles.
  GridRule grid;
  SymExpr blocks = 0;  // grid.x * grid.y: the partial records of each tap
  int bits() const;    // the kernel's kStats
  // The template arguments kStats (and StatsAs: `output` when `with_type`) appended to `args`
  // when the kernel computes any (none otherwise: the plain kernel's name is unchanged).
  void append_args(std::vector<std::string>& args, DType output, bool with_type) const;
  std::string text() const;  // " + statistics of its input into record 3", or ""
};
// The tiled kernel that may compute statistics: what its register budget (and so its resident
// blocks per SM) depends on (launch_rules.h, tile_register_budget).
struct TileKernelShape {
  int input_bytes = 2;
  int loads = 1;  // input vectors per element (the Op's kLoads)
  bool transpose = false;
  bool dbias = false;
};
// Fails (no kernel) for a TensorStats part reading anything but `input` or `output`.
FusedStats fused_stats(SequenceBuilder& b, const Group& g, ValueId input, ValueId output,
                       const GridRule& tile, const TileKernelShape& shape);
// After the kernel's launch: one tensor_stats_final per record.
void emit_fused_stats_merge(SequenceBuilder& b, const Group& g, const FusedStats& stats);

void emit_dbias(SequenceBuilder& b, const Group& g);
void emit_bias_add(SequenceBuilder& b, const Group& g);
void emit_norm_fwd(SequenceBuilder& b, const Group& g);
void emit_norm_bwd(SequenceBuilder& b, const Group& g);
void emit_activation_fwd(SequenceBuilder& b, const Group& g);
void emit_activation_bwd(SequenceBuilder& b, const Group& g);
// A user-defined op's learned parameters (the `learned` pointer arrays of templates/activation.cuh
// and row_expr.cuh, as long as ir::kMaxUserParams): the operands from `first`, nullptr past them.
ParamBinding bind_learned(SequenceBuilder& b, const ir::Operation& op, size_t first);
// The learned parameters' gradients from `partial_rows` rows of column sums per parameter
// (learned_partial): reduce_column_partials, and for a scalar learned_scalar_sum after it.
void emit_learned_gradients(SequenceBuilder& b, const Group& g, const ir::Operation& op,
                            std::span<const ir::UserParam> learned,
                            const std::vector<int>& partials, const SymExpr& partial_rows,
                            int64_t cols);

// ---- norm-like user-defined ops (emit_row.cpp) -------------------------------------------------

void emit_row_fwd(SequenceBuilder& b, const Group& g);
void emit_row_bwd(SequenceBuilder& b, const Group& g);
void emit_alias(SequenceBuilder& b, const Group& g);
void emit_constant_scale(SequenceBuilder& b, const Group& g);
void emit_quantize(SequenceBuilder& b, const Group& g);
// y = dequantize(quantize(x)) through `op`'s quantizer (an amax pass first under current scaling).
void emit_fake_quantize(SequenceBuilder& b, const Group& g, const ir::Operation& op);

// ---- dropout (emit_dropout.cpp) -----------------------------------------------------------------

// Training forward: templates/dropout.cuh draws the Philox mask, writes y and the mask bits; the
// inference variant is an alias of x (no launch). Backward: dx from dy and the saved bits.
void emit_dropout(SequenceBuilder& b, const Group& g);
void emit_dropout_bwd(SequenceBuilder& b, const Group& g);
// End of step: one dropout_advance_step launch (group -1, which end_step() runs) where the
// sequence has a dropout, so the next step draws new masks.
void emit_dropout_step_advance(SequenceBuilder& b);

// ---- GEMM operands a debug config modifies (emit_modify.cpp) ------------------------------------

void emit_modify_tensor(SequenceBuilder& b, const Group& g);

// ---- GEMMs (emit_gemms.cpp) ---------------------------------------------------------------------

void emit_fprop(SequenceBuilder& b, const Group& g);
void emit_dgrad(SequenceBuilder& b, const Group& g);
void emit_wgrad(SequenceBuilder& b, const Group& g);

}  // namespace opfuse::codegen::emitters
