// The buffers of quantized boundaries and of block-scaled copies (note "Quantized boundaries" in
// docs/architecture.md; note "Block scale grids" in runtime/cpu/block_quantization.h): each
// copy's scale grid, the scales a quantized input's caller gives, and the interface names of a
// quantized output's pieces.

#include <fmt/format.h>

#include "codegen/plan_builder.h"
#include "support/assert.h"

namespace opfuse::codegen {

// A caller's buffer of one FP32 value, "<name>", made once.
int SequenceBuilder::add_boundary_input(const std::string& name) {
  for (const Buffer& b : out_.buffers)
    if (b.name == name && b.role == BufferRole::Input) return b.id;
  Buffer s;
  s.id = int(out_.buffers.size());
  s.name = name;
  s.role = BufferRole::Input;
  s.dtype = DType::FP32;
  s.shape = {SymExpr(1)};
  s.bytes = SymExpr(4);
  out_.buffers.push_back(std::move(s));
  return out_.buffers.back().id;
}

// A quantized input's copy `v` (buffer `data`) reads the caller's scales: per tensor, the FP32
// scale_inv both copies share ("%<input>.scale_inv"); with blocks, the copy's grid (made by
// add_scale_grid) becomes an input too; NVFP4 adds the copy's S_enc ("<copy>.tensor_scale").
void SequenceBuilder::add_boundary_scales(const ir::Value& v, int data, bool block_scaled) {
  const ir::QuantizerDecl& q = seq_.quantizers.at(size_t(v.quantizer));
  if (!block_scaled) {
    const int scale_inv = add_boundary_input("%" + q.name + ".scale_inv");
    out_.buffers[size_t(data)].scale_inv.buffer = scale_inv;
    return;
  }
  const int grid = out_.buffers[size_t(data)].scale_inv.buffer;
  OPFUSE_ASSERT(grid >= 0, "quantized input copy {} has no scale grid",
                out_.buffers[size_t(data)].name);
  out_.buffers[size_t(grid)].role = BufferRole::Input;
  out_.buffers[size_t(data)].role = BufferRole::Input;
  if (q.spec.nvfp4())
    tensor_scale_of_[v.id] = add_boundary_input(out_.buffers[size_t(data)].name + ".tensor_scale");
}

// A quantized output's column-wise copy and its scale grids are outputs too; a per-tensor
// scale_inv and NVFP4's tensor scales stay their quantizers' scalars (the runtime reads them).
void SequenceBuilder::tag_quantized_output() {
  const auto& q = seq_.quantized_output;
  if (!q) return;
  const std::string& name = seq_.outputs.at(0).name;
  if (q->columnwise != ir::kNoValue && buffer_of_.at(q->columnwise) >= 0) {
    out_.buffers[size_t(buffer_of_[q->columnwise])].interface.push_back(
        {InterfaceKind::Output, name + ".columnwise"});
  }
  for (const auto& [v, suffix] : {std::pair{seq_.outputs[0].value, ".scale_inv"},
                                  std::pair{q->columnwise, ".columnwise.scale_inv"}}) {
    if (v == ir::kNoValue) continue;
    const int grid = out_.buffers[size_t(buffer_of_.at(v))].scale_inv.buffer;
    if (grid >= 0)
      out_.buffers[size_t(grid)].interface.push_back({InterfaceKind::Output, name + suffix});
  }
}

// The scale grid of a block-scaled or micro-scaled copy, a buffer of its own that the cast
// writes next to the data and the GEMMs (or the decode) read with it. The stored matrix is the
// copy as laid out: [rows..., k] as is, [k, rows...] transposed. Float8 blocks: note "Block
// scale grids" (FP32, padded for cuBLASLt); MXFP8 (E8M0) and NVFP4 (E4M3): the compact layouts
// of runtime/cpu/micro_scaling.h, one byte per block of the stored matrix, along its rows except
// MXFP8's column-wise copy (32 x 1 blocks down the columns of x's own layout).
void SequenceBuilder::add_scale_grid(const ir::Value& v, bool transposed) {
  const ir::Shape& shape = v.type.shape;
  const SymExpr rows =
      transposed ? shape_product(shape, 0, 1) : shape_product(shape, 0, shape.size() - 1);
  const SymExpr cols = transposed ? shape_product(shape, 1, shape.size())
                                  : shape_product(shape, shape.size() - 1, shape.size());
  const plan::QuantSpec& spec = seq_.quantizers.at(size_t(v.quantizer)).spec;
  Buffer& data = out_.buffers.back();
  std::vector<SymExpr> grid;
  DType dtype = DType::FP32;
  if (spec.micro_scaled()) {
    const int64_t block = spec.block.cols;
    const bool down_columns = !spec.nvfp4() && data.usage == CopyUsage::Columnwise;
    grid = down_columns ? std::vector<SymExpr>{ceil_div(rows, block), cols}
                        : std::vector<SymExpr>{rows, ceil_div(cols, block)};
    dtype = spec.nvfp4() ? DType::E4M3 : DType::E8M0;
  } else {
    const bool two_d = spec.scaling == plan::ScalingKind::Block2D;
    const int64_t block = spec.block.cols;
    grid = two_d
               ? std::vector<SymExpr>{ceil_div(rows, block), ceil_div(ceil_div(cols, block), 4) * 4}
               : std::vector<SymExpr>{ceil_div(cols, block), ceil_div(rows, 4) * 4};
  }
  Buffer g;
  g.id = int(out_.buffers.size());
  g.name = data.name + ".scale_inv";
  g.role = BufferRole::Result;
  g.dtype = dtype;
  g.bytes = grid[0] * grid[1] * plan::dtype_bytes(dtype);
  g.shape = std::move(grid);
  g.usage = data.usage;
  g.layout = data.layout;
  data.scale_inv.buffer = g.id;
  out_.buffers.push_back(std::move(g));
}

}  // namespace opfuse::codegen
