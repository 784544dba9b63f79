#include <cstdio>
#include <cstring>

#include "opfuse/version.h"

int main() {
  std::printf("opfuse %s codegen %d\n", opfuse::version(), opfuse::kCodegenVersion);
  return std::strlen(opfuse::version()) > 0 ? 0 : 1;
}
