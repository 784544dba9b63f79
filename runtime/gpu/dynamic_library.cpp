#include "gpu/dynamic_library.h"

#include <link.h>

#include <cstdlib>

namespace opfuse::gpu {

std::string environment_value(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string dlerror_text() {
  const char* text = ::dlerror();
  return text == nullptr ? std::string("unknown error") : std::string(text);
}

std::string loaded_library_path(void* handle, const std::string& fallback) {
  if (link_map* map = nullptr; ::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr &&
                               map->l_name != nullptr && *map->l_name != '\0') {
    return map->l_name;
  }
  return fallback;
}

}  // namespace opfuse::gpu
