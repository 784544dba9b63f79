// The ParamBinding constructors the group emitters bind kernel params with (plan_builder.h), and
// the symbolic sizes of IR shapes.
#include "codegen/plan_builder.h"

namespace opfuse::codegen {

SymExpr dim_expr(const ir::Dim& d) {
  if (!d.is_symbolic()) return d.size;
  return exact_div(SymExpr::symbol(d.symbol), d.divisor);
}

SymExpr shape_product(const ir::Shape& shape, size_t begin, size_t end) {
  SymExpr product = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) product = product * dim_expr(shape[i]);
  return product;
}

SymExpr element_count_expr(const ir::Shape& shape) { return shape_product(shape, 0, shape.size()); }

ParamBinding bind_null(std::string field) {
  ParamBinding p;
  p.field = std::move(field);
  return p;
}

ParamBinding bind_in(std::string field, int buffer) {
  ParamBinding p = bind_null(std::move(field));
  if (buffer < 0) return p;
  p.kind = ParamKind::Buffer;
  p.buffers = {buffer};
  return p;
}

ParamBinding bind_out(std::string field, int buffer) {
  ParamBinding p = bind_in(std::move(field), buffer);
  p.written = buffer >= 0;
  return p;
}

ParamBinding bind_buffers(std::string field, std::vector<int> buffers, bool written) {
  ParamBinding p = bind_null(std::move(field));
  p.kind = ParamKind::Buffers;
  p.written = written;
  p.buffers = std::move(buffers);
  return p;
}

ParamBinding bind_copy(std::string field, int buffer) {
  ParamBinding p = bind_out(std::move(field), buffer);
  p.columnwise_copy = buffer >= 0;
  return p;
}

ParamBinding bind_quantizer(std::string field, int quantizer, QuantizerValue value) {
  ParamBinding p = bind_null(std::move(field));
  if (quantizer < 0) return p;
  p.kind = ParamKind::Quantizer;
  p.quantizer = quantizer;
  p.quantizer_value = value;
  return p;
}

ParamBinding bind_records(std::string field, std::vector<int> quantizers) {
  ParamBinding p = bind_null(std::move(field));
  p.kind = ParamKind::Records;
  p.records = std::move(quantizers);
  return p;
}

ParamBinding bind_int(std::string field, SymExpr value) {
  ParamBinding p = bind_null(std::move(field));
  p.kind = ParamKind::Int;
  p.int_value = std::move(value);
  return p;
}

ParamBinding bind_stat_record(std::string field, int slot) {
  ParamBinding p = bind_null(std::move(field));
  p.kind = ParamKind::StatRecord;
  p.int_value = SymExpr(int64_t(slot));
  return p;
}

ParamBinding bind_capture(std::string field, int slot) {
  ParamBinding p = bind_null(std::move(field));
  p.kind = ParamKind::Capture;
  p.int_value = SymExpr(int64_t(slot));
  return p;
}

ParamBinding bind_int64(std::string field, SymExpr value) {
  ParamBinding p = bind_int(std::move(field), std::move(value));
  p.kind = ParamKind::Int64;
  return p;
}

ParamBinding bind_float(std::string field, double value) {
  ParamBinding p = bind_null(std::move(field));
  p.kind = ParamKind::Float;
  p.float_value = value;
  return p;
}

}  // namespace opfuse::codegen
