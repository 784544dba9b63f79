#include "ir/graph.h"

#include <algorithm>

namespace opfuse::ir {

std::vector<std::string> Sequence::symbols() const {
  std::vector<std::string> out;
  for (const Value& v : values)
    for (const Dim& d : v.type.shape)
      if (d.is_symbolic()) out.push_back(d.symbol);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

ValueId Sequence::add_value(ValueKind kind, TensorType type, std::string name) {
  Value v;
  v.id = ValueId(values.size());
  v.kind = kind;
  v.type = std::move(type);
  v.name = std::move(name);
  values.push_back(std::move(v));
  return values.back().id;
}

const Sequence* Program::find_sequence(std::string_view name) const {
  for (const Sequence& s : sequences)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace opfuse::ir
