// The application's precision-debug features (opfuse/debug_feature.h) as the config reader's and
// the routing's features (compiler/debug_config/feature.h): one adapter per DebugFeature.
// Internal to the runtime.
#pragma once

#include <memory>
#include <vector>

#include "debug_config/feature.h"
#include "opfuse/debug_feature.h"

namespace opfuse::api {

// The built-in features plus `features`. Throws UsageError for a feature without a name or with
// the name of another (built-in or given), or with a key the config schema reserves.
std::shared_ptr<const debug::FeatureRegistry> feature_registry(
    const std::vector<std::shared_ptr<const DebugFeature>>& features);

}  // namespace opfuse::api
