// The shape rules of the fixed ops (compiler/ir/op_shape_rules.h).
#include "ir/op_shape_rules.h"

#include <fmt/format.h>

#include <limits>

#include "../../templates/common/philox.cuh"
#include "ir/pointwise_ops.h"
#include "support/spelling.h"

namespace opfuse::ir::shape_rules {

// ---- shape rules ------------------------------------------------------------------------------

bool last_dim_is(const ShapeInput& in, int64_t size, const char* attr, const char* what,
                 ShapeResult& r) {
  if (in.in.shape.empty()) {
    r.errors.push_back({"", fmt::format("{} needs a tensor of rank >= 1, got a scalar", what), ""});
    return false;
  }
  const Dim& last = in.in.shape.back();
  if (last.is_symbolic()) {
    r.errors.push_back({attr,
                        fmt::format("{} needs a known last dimension, but the incoming tensor {} "
                                    "ends in the symbolic dimension '{}'",
                                    what, type_string(in.in), last.symbol),
                        "bind the last dimension to a constant in the sequence signature"});
    return false;
  }
  if (last.size != size) {
    r.errors.push_back({attr,
                        fmt::format("{} = {} does not match the incoming last dimension {} of {}",
                                    attr, size, last.size, type_string(in.in)),
                        fmt::format("set {} = {} or change the op before it", attr, last.size)});
    return false;
  }
  return true;
}

ShapeResult same_shape(const ShapeInput& in) { return {in.in, {}, {}}; }

// A norm's gamma starts as the identity scale: 1, or 0 when stored minus one (zero centered).
ParamInit gamma_init(const AttrList& attrs) {
  return ParamInit::constant(attr_bool(attrs, "zero_centered_gamma") ? 0.0 : 1.0);
}

ShapeResult layernorm_shape(const ShapeInput& in) {
  ShapeResult r{in.in, {}, {}};
  const int64_t size = attr_int(in.attrs, "size");
  if (!last_dim_is(in, size, "size", "layernorm", r)) return r;
  const TensorType vec{in.in.dtype, {Dim::known(size)}};
  r.params = {{"weight", vec, gamma_init(in.attrs)}, {"bias", vec, ParamInit::constant(0)}};
  return r;
}

ShapeResult rmsnorm_shape(const ShapeInput& in) {
  ShapeResult r{in.in, {}, {}};
  const int64_t size = attr_int(in.attrs, "size");
  if (!last_dim_is(in, size, "size", "rmsnorm", r)) return r;
  r.params = {{"weight", TensorType{in.in.dtype, {Dim::known(size)}}, gamma_init(in.attrs)}};
  return r;
}

// `in` and `out` are the layer's features as written (unsharded); a tensor-parallel rank holds
// out / tp of them (column) or reads in / tp (row), the sizes its GEMMs see.
ShapeResult linear_shape(const ShapeInput& in) {
  ShapeResult r{in.in, {}, {}};
  int64_t in_features = attr_int(in.attrs, "in");
  int64_t out_features = attr_int(in.attrs, "out");
  const LinearParallel mode = linear_parallel(in.attrs);
  if (mode == LinearParallel::Invalid) {
    r.errors.push_back({"parallel",
                        fmt::format("parallel = {} is not a tensor-parallel mode",
                                    attr_name(in.attrs, "parallel")),
                        "write parallel = column (split the output features) or parallel = row "
                        "(split the input features)"});
    return r;
  }
  if (const std::string& precision = attr_name(in.attrs, "precision");
      !precision.empty() && precision != "high") {
    r.errors.push_back({"precision", fmt::format("precision = {} is not a precision", precision),
                        "write precision = high (the layer's GEMMs in high precision under any "
                        "recipe) or leave it out (as the recipe says)"});
    return r;
  }
  plan::ShardSpec weight_shard, bias_shard;
  if (mode == LinearParallel::Column && in.tp > 1) {
    if (out_features % in.tp != 0) {
      r.errors.push_back({"out",
                          fmt::format("out = {} does not divide over tp = {} ranks (a "
                                      "column-parallel linear splits its output features)",
                                      out_features, in.tp),
                          "make out a multiple of tp"});
      return r;
    }
    out_features /= in.tp;
    weight_shard = bias_shard = plan::ShardSpec{0, 1};
  } else if (mode == LinearParallel::Row && in.tp > 1) {
    if (in_features % in.tp != 0) {
      r.errors.push_back({"in",
                          fmt::format("in = {} does not divide over tp = {} ranks (a row-parallel "
                                      "linear splits its input features)",
                                      in_features, in.tp),
                          "make in a multiple of tp"});
      return r;
    }
    in_features /= in.tp;
    weight_shard = plan::ShardSpec{1, 1};
    if (!in.in.shape.empty() && !in.in.shape.back().is_symbolic() &&
        in.in.shape.back().size != in_features) {
      r.errors.push_back(
          {"in",
           fmt::format("a row-parallel linear reads in / tp = {} / {} = {} features on each "
                       "rank, but the incoming tensor is {}",
                       attr_int(in.attrs, "in"), in.tp, in_features, type_string(in.in)),
           "make the linear before it column-parallel, so each rank holds its share"});
      return r;
    }
  }
  if (!last_dim_is(in, in_features, "in", "linear", r)) return r;
  r.out.shape.back() = Dim::known(out_features);
  // TE's default init_method: normal with std 0.02; biases start at zero.
  r.params = {{"weight",
               TensorType{in.in.dtype, {Dim::known(out_features), Dim::known(in_features)}},
               ParamInit::normal(0.02), weight_shard}};
  if (attr_bool(in.attrs, "bias"))
    r.params.push_back({"bias", TensorType{in.in.dtype, {Dim::known(out_features)}},
                        ParamInit::constant(0), bias_shard});
  return r;
}

// all_gather / reduce_scatter along `dim`: the rank's share of it times / over tp. Only the
// leading dimension (the tokens, contiguous per rank) is supported.
ShapeResult collective_shape(const ShapeInput& in, bool gather) {
  ShapeResult r{in.in, {}, {}};
  const char* what = gather ? "all_gather" : "reduce_scatter";
  const int64_t dim = attr_int(in.attrs, "dim");
  if (dim != 0) {
    r.errors.push_back({"dim",
                        fmt::format("{} along dim {} is not supported: only dim 0 (the tokens, "
                                    "which each rank holds contiguously)",
                                    what, dim),
                        "gather or scatter the tokens (dim = 0)"});
    return r;
  }
  if (in.in.shape.size() < 2) {
    r.errors.push_back(
        {"", fmt::format("{} needs a tensor of rank >= 2, got {}", what, type_string(in.in)), ""});
    return r;
  }
  if (in.tp == 1) return r;
  Dim& d = r.out.shape[0];
  if (gather) {
    if (d.is_symbolic()) {
      if (d.divisor % in.tp != 0) {
        r.errors.push_back({"",
                            fmt::format("all_gather of {}: dimension 0 is {}, not a rank's "
                                        "share of a size",
                                        type_string(in.in), dim_string(d)),
                            "split the tokens over the ranks: tokens / tp"});
        return r;
      }
      d.divisor /= in.tp;
    } else {
      d.size *= in.tp;
    }
  } else if (d.is_symbolic()) {
    d.divisor *= in.tp;
  } else if (d.size % in.tp != 0) {
    r.errors.push_back({"",
                        fmt::format("reduce_scatter of {}: dimension 0 = {} does not divide "
                                    "over tp = {} ranks",
                                    type_string(in.in), d.size, in.tp),
                        ""});
    return r;
  } else {
    d.size /= in.tp;
  }
  return r;
}
ShapeResult all_gather_shape(const ShapeInput& in) { return collective_shape(in, true); }
ShapeResult reduce_scatter_shape(const ShapeInput& in) { return collective_shape(in, false); }

ShapeResult bias_shape(const ShapeInput& in) {
  ShapeResult r{in.in, {}, {}};
  const int64_t size = attr_int(in.attrs, "size");
  if (!last_dim_is(in, size, "size", "bias", r)) return r;
  r.params = {{"bias", TensorType{in.in.dtype, {Dim::known(size)}}, ParamInit::constant(0)}};
  return r;
}

// TE's gated activations take [..., 2n] and return [..., n]; the first half is the gate.
ShapeResult gated_shape(const ShapeInput& in) {
  ShapeResult r{in.in, {}, {}};
  if (in.in.shape.empty()) {
    r.errors.push_back({"", "a gated activation needs a tensor of rank >= 1", ""});
    return r;
  }
  const Dim& last = in.in.shape.back();
  if (last.is_symbolic()) {
    r.errors.push_back({"",
                        fmt::format("a gated activation halves the last dimension, which must be "
                                    "known; {} ends in the symbolic '{}'",
                                    type_string(in.in), last.symbol),
                        ""});
    return r;
  }
  if (last.size % 2 != 0) {
    r.errors.push_back({"",
                        fmt::format("a gated activation splits the last dimension in two halves, "
                                    "but {} has an odd width {}",
                                    type_string(in.in), last.size),
                        "make the producing linear's out even (twice the activation's width)"});
    return r;
  }
  r.out.shape.back() = Dim::known(last.size / 2);
  return r;
}

// The carriers of user-defined ops: the shape of the op (plain or gated) and its learned
// parameters (docs/language.md, "User-defined ops"): a scalar is one element; one per feature
// needs a known last dimension of the output equal to the declared size.
ShapeResult user_op_shape(const ShapeInput& in, bool gated) {
  ShapeResult r = gated ? gated_shape(in) : same_shape(in);
  if (!r.errors.empty()) return r;
  const std::string& op = attr_name(in.attrs, "op");
  for (const UserParam& p : user_params(user_pointwise_def(gated), in.attrs)) {
    Shape shape = {Dim::known(1)};
    if (p.size > 0) {
      const Dim* last = r.out.shape.empty() ? nullptr : &r.out.shape.back();
      if (last == nullptr || last->is_symbolic() || last->size != p.size) {
        r.errors.push_back(
            {"",
             fmt::format("parameter '{}' of '{}' has {} features, but the op's output {} {}",
                         p.name, op, p.size, type_string(r.out),
                         last == nullptr       ? "has no last dimension"
                         : last->is_symbolic() ? "ends in a symbolic dimension"
                                               : fmt::format("has {}", last->size)),
             gated ? "a gated op's per-feature parameter has the output half's features"
                   : "a per-feature parameter has the size of the last dimension"});
        continue;
      }
      shape = {Dim::known(p.size)};
    }
    r.params.push_back(
        {p.name, TensorType{p.dtype, std::move(shape)}, ParamInit::constant(p.init)});
  }
  return r;
}
ShapeResult user_plain_shape(const ShapeInput& in) { return user_op_shape(in, false); }
ShapeResult user_norm_shape(const ShapeInput& in) { return user_op_shape(in, false); }
ShapeResult user_gated_shape(const ShapeInput& in) { return user_op_shape(in, true); }

ShapeResult extra_shape(const ShapeInput& in, const char* what) {
  ShapeResult r{in.in, {}, {}};
  if (in.extra != nullptr && !(*in.extra == in.in)) {
    r.errors.push_back(
        {"name",
         fmt::format("{} '{}' has type {}, but the tensor at this point is {}", what,
                     attr_name(in.attrs, "name"), type_string(*in.extra), type_string(in.in)),
         "declare it with the same dtype and shape in the sequence signature"});
  }
  return r;
}
ShapeResult add_extra_input_shape(const ShapeInput& in) { return extra_shape(in, "extra input"); }
ShapeResult make_extra_output_shape(const ShapeInput& in) {
  return extra_shape(in, "extra output");
}

ShapeResult reshape_shape(const ShapeInput& in) {
  ShapeResult r{in.in, {}, {}};
  const Shape& want = attr_shape(in.attrs, "shape");
  int inferred = -1;
  Shape out;
  for (size_t i = 0; i < want.size(); ++i) {
    const Dim& d = want[i];
    if (!d.is_symbolic() && d.size == -1) {
      if (inferred >= 0) {
        r.errors.push_back({"shape", "reshape may infer at most one dimension (-1)", ""});
        return r;
      }
      inferred = static_cast<int>(i);
    } else if (!d.is_symbolic() && d.size <= 0) {
      r.errors.push_back(
          {"shape", fmt::format("reshape dimension {} must be positive, got {}", i, d.size), ""});
      return r;
    }
    out.push_back(d);
  }
  const ElementCount have = element_count(in.in.shape);
  Shape known_part = out;
  if (inferred >= 0) known_part.erase(known_part.begin() + inferred);
  ElementCount rest = element_count(known_part);
  if (have.overflowed || rest.overflowed) {
    r.errors.push_back({"shape", "reshape: element count overflows int64", ""});
    return r;
  }
  if (rest.symbols != have.symbols) {
    r.errors.push_back({"shape",
                        fmt::format("reshape to {} must keep the symbolic dimensions of {}",
                                    shape_string(want), type_string(in.in)),
                        "a -1 can only stand for known sizes"});
    return r;
  }
  if (inferred >= 0) {
    if (rest.known == 0 || have.known % rest.known != 0) {
      r.errors.push_back({"shape",
                          fmt::format("reshape cannot infer -1: {} elements do not divide into {}",
                                      have.known, shape_string(want)),
                          ""});
      return r;
    }
    out[inferred] = Dim::known(have.known / rest.known);
  } else if (rest.known != have.known) {
    r.errors.push_back({"shape",
                        fmt::format("reshape to {} changes the number of elements of {}",
                                    shape_string(want), type_string(in.in)),
                        ""});
    return r;
  }
  r.out.shape = std::move(out);
  return r;
}

// Dropout keeps an element when its Philox word >= ceil(p * 2^32): a p that rounds to 2^32 keeps
// nothing (and scales by 1 / (1 - p)), refused as p = 1 is. Its mask has ceil(n / 32) words per
// row of n elements: n must be known.
ShapeResult dropout_shape(const ShapeInput& in) {
  ShapeResult r{in.in, {}, {}};
  if (in.in.shape.empty() || in.in.shape.back().is_symbolic())
    r.errors.push_back(
        {"",
         fmt::format("dropout needs a known last dimension, but the incoming tensor is {}",
                     type_string(in.in)),
         "bind the last dimension to a constant in the sequence signature"});
  const double p = attr_float(in.attrs, "p");
  if (!(p < 1) || opfuse::dropout_threshold(p) > 0xFFFFFFFFull)
    r.errors.push_back({"p", fmt::format("dropout p = {} drops every element", p),
                        "p is the drop probability: it must be below 1"});
  return r;
}

}  // namespace opfuse::ir::shape_rules
