#include "plan/enums.h"

namespace opfuse::plan {

bool epilogue_has_aux(GemmEpilogue e) {
  return e == GemmEpilogue::GeluAuxBias || e == GemmEpilogue::DGelu ||
         e == GemmEpilogue::DGeluBiasGrad;
}

bool epilogue_has_bias(GemmEpilogue e) {
  return e == GemmEpilogue::Bias || e == GemmEpilogue::GeluAuxBias ||
         e == GemmEpilogue::DGeluBiasGrad || e == GemmEpilogue::BiasGradA;
}

bool epilogue_writes_bias(GemmEpilogue e) {
  return e == GemmEpilogue::DGeluBiasGrad || e == GemmEpilogue::BiasGradA;
}

bool epilogue_writes_aux(GemmEpilogue e) { return e == GemmEpilogue::GeluAuxBias; }

}  // namespace opfuse::plan
