// A debug config applied to a program's layers (docs/debugging.md, "Routing"): which section each
// layer gets, then, per iteration, TE's routing calls answered for every layer, GEMM and tensor.
// The answers at an iteration (a Routing) are what a plan variant is compiled from; `next_change`
// says until when they hold, so the runtime asks again only then.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "debug_config/config.h"
#include "ir/graph.h"

namespace opfuse::debug {

// A layer of the program as the config sees it: a linear op's name (`as fc1`, else `linear_<k>`).
struct LayerInfo {
  std::string name;
  SourceLoc loc;
  bool quantized = false;  // its sequence's recipe quantizes GEMMs (else all run in high precision)
};

struct LayerBinding {
  std::string layer;
  bool quantized = false;
  const ConfigSection* section = nullptr;  // nullptr: no enabled section matches it
};

// The layers of `program`: its linear ops, in sequence and op order (forward ops only).
std::vector<LayerInfo> program_layers(const ir::Program& program);

// Matches every enabled section against `layers`. Error: a layer matched by two enabled sections
// (however each selects it). Warning: a section that matches no layer (naming the layers it could
// have meant).
std::vector<LayerBinding> bind_layers(const DebugConfig& config,
                                      const std::vector<LayerInfo>& layers,
                                      DiagnosticEngine& diags);

// What a GEMM does with one operand.
enum class OperandAction : uint8_t {
  Quantize,       // cast under the recipe's spec
  HighPrecision,  // read as is (the GEMM runs in high precision)
  Modify,         // replaced by a feature's modify_tensor (FakeQuant, PerTensorScaling, ...)
};
std::string_view operand_action_name(OperandAction a);

struct GemmRouting {
  bool quantized = true;                            // fp8_gemm_enabled (and a quantized recipe)
  std::array<OperandAction, 2> operands{};          // in operands_of(gemm) order
  std::array<const FeatureConfig*, 2> modifiers{};  // the feature modifying each, or nullptr
  // What each modifier's modify_tensor returned (nullopt: no modifier, or it returned none).
  std::array<std::optional<Modification>, 2> modifications{};
};

struct LayerRouting {
  std::string layer;
  bool recipe_quantized = false;
  const ConfigSection* section = nullptr;
  std::array<GemmRouting, 3> gemms{};  // by GemmRole
  // The features inspecting each tensor this iteration (by TensorKind).
  std::array<std::vector<const FeatureConfig*>, 6> inspectors{};
  // A layer with nothing inspected, modified or taken out of quantization runs its plain plan.
  bool active() const;
};

struct Routing {
  int64_t iteration = 0;
  int64_t next_change = kNever;  // the first later iteration whose answers may differ
  std::vector<LayerRouting> layers;
  // Two features modifying one GEMM operand of a layer (TE allows one): the second is ignored and
  // named here; the caller reports it as an error.
  std::vector<std::string> conflicts;
  // A text naming every decision (not the iteration): equal keys compile to the same variant.
  std::string variant_key() const;
};

// Asks the routing calls for every bound layer at `iteration`. A layer whose recipe does not
// quantize runs every GEMM in high precision whatever the features say.
Routing route(const std::vector<LayerBinding>& bindings, int64_t iteration);

// Human-readable routing of one layer (for `fusec debug-plan` and the debug log):
//   fc1: section 'log_fc' (debug.yaml:1:1)
//     fprop: quantized; activation: quantize, weight: quantize
//     activation: inspected by LogTensorStats
std::string describe(const LayerRouting& layer, const SourceManager& sources);

}  // namespace opfuse::debug
