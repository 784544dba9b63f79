// The bytes of a generated kernel's params struct, built from a launch step's ParamBindings
// (docs/codegen.md, "Steps"). The layout follows templates/README.md's conventions: fields in
// binding order, pointers 8 bytes, `int` and `float` 4, `long long` 8, each at its natural
// alignment, an array field (Kind::Buffers) one pointer per entry, and the struct's size rounded
// up to its largest alignment. Pure host code: the CPU tests check it against the cubins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace opfuse::gpu {

struct ParamField {
  std::size_t offset = 0;
  std::size_t bytes = 0;  // 8 per pointer of an array field
  std::size_t alignment = 1;
};

struct ParamLayout {
  std::vector<ParamField> fields;  // one per binding, in binding order
  std::size_t bytes = 0;           // the struct's size: a multiple of `alignment`
  std::size_t alignment = 1;
};

// Throws UsageError for an array field (Kind::Buffers) without entries.
ParamLayout param_layout(const std::vector<plan::ParamBinding>& params);

// A buffer pointer inside the struct, written at each launch because buffers are allocated per
// step; `buffer` is a plan buffer id.
struct BufferSlot {
  std::size_t offset = 0;
  int buffer = -1;
};

// A params struct with what bind() knows filled in (integers, floats, quantizer-state pointers,
// nulls) and the places its buffer pointers go.
struct PackedParams {
  std::vector<unsigned char> bytes;
  std::vector<BufferSlot> buffer_slots;

  // Writes every buffer slot from `pointer_of(buffer id)`.
  template <typename PointerOf>
  void set_buffers(PointerOf&& pointer_of) {
    for (const BufferSlot& slot : buffer_slots) {
      const void* pointer = pointer_of(slot.buffer);
      std::memcpy(bytes.data() + slot.offset, &pointer, sizeof(pointer));
    }
  }
};

// The device pointer of a Quantizer binding (its scale, scale_inv or amax) or of a Records
// binding (the first record); only called for those two kinds.
using StatePointer = std::function<const void*(const plan::ParamBinding&)>;

// Packs `params`: Int and Int64 values are evaluated with `symbols` (the bound sizes and
// num_sms). Throws UsageError for an Int that does not fit 32 bits or a negative size, naming the
// field.
PackedParams pack_params(const std::vector<plan::ParamBinding>& params,
                         const std::map<std::string, std::int64_t>& symbols,
                         const StatePointer& state_pointer);

// The value of a plan expression under `symbols` (a known expression needs none).
std::int64_t evaluate_expr(const plan::SymExpr& expr,
                           const std::map<std::string, std::int64_t>& symbols);

}  // namespace opfuse::gpu
