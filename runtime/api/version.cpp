#include "opfuse/version.h"

namespace opfuse {

const char* version() { return OPFUSE_VERSION; }

}  // namespace opfuse
