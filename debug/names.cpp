#include "debug/names.h"

namespace opfuse::debug {

std::span<const GemmRole> gemms_of(TensorKind t) {
  static constexpr GemmRole kActivation[] = {GemmRole::Fprop, GemmRole::Wgrad};
  static constexpr GemmRole kWeight[] = {GemmRole::Fprop, GemmRole::Dgrad};
  static constexpr GemmRole kGradient[] = {GemmRole::Dgrad, GemmRole::Wgrad};
  static constexpr GemmRole kOutput[] = {GemmRole::Fprop};
  static constexpr GemmRole kDgrad[] = {GemmRole::Dgrad};
  static constexpr GemmRole kWgrad[] = {GemmRole::Wgrad};
  switch (t) {
    case TensorKind::Activation:
      return kActivation;
    case TensorKind::Weight:
      return kWeight;
    case TensorKind::Gradient:
      return kGradient;
    case TensorKind::Output:
      return kOutput;
    case TensorKind::Dgrad:
      return kDgrad;
    case TensorKind::Wgrad:
      return kWgrad;
  }
  return {};
}

std::span<const TensorKind> operands_of(GemmRole g) {
  static constexpr TensorKind kFprop[] = {TensorKind::Activation, TensorKind::Weight};
  static constexpr TensorKind kDgrad[] = {TensorKind::Gradient, TensorKind::Weight};
  static constexpr TensorKind kWgrad[] = {TensorKind::Gradient, TensorKind::Activation};
  switch (g) {
    case GemmRole::Fprop:
      return kFprop;
    case GemmRole::Dgrad:
      return kDgrad;
    case GemmRole::Wgrad:
      return kWgrad;
  }
  return {};
}

TensorKind result_of(GemmRole g) {
  switch (g) {
    case GemmRole::Fprop:
      return TensorKind::Output;
    case GemmRole::Dgrad:
      return TensorKind::Dgrad;
    case GemmRole::Wgrad:
      return TensorKind::Wgrad;
  }
  return TensorKind::Output;
}

}  // namespace opfuse::debug
