// Internal invariants (bugs in opfuse, not user errors): print file:line and the compared values,
// then throw InternalError so tools exit with code 3 instead of crashing.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace opfuse {

struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

[[noreturn]] inline void internal_failure(const char* file, int line, const std::string& what) {
  throw InternalError(fmt::format("{}:{}: internal error: {}", file, line, what));
}

}  // namespace opfuse

#define OPFUSE_ASSERT(cond, ...)                                                               \
  do {                                                                                         \
    if (!(cond))                                                                               \
      ::opfuse::internal_failure(__FILE__, __LINE__,                                           \
                                 "assertion `" #cond "` failed. " + fmt::format(__VA_ARGS__)); \
  } while (0)

#define OPFUSE_ASSERT_EQ(a, b)                                                           \
  do {                                                                                   \
    const auto& opfuse_a_ = (a);                                                         \
    const auto& opfuse_b_ = (b);                                                         \
    if (!(opfuse_a_ == opfuse_b_))                                                       \
      ::opfuse::internal_failure(                                                        \
          __FILE__, __LINE__,                                                            \
          fmt::format("expected {} == {}, got {} vs {}", #a, #b, opfuse_a_, opfuse_b_)); \
  } while (0)
