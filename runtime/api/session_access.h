// Internal access to what a Session runs on, for the runtime's own tools (fusec bench's step
// observer and step profiles). Not part of the embedding API: applications never include it.
#pragma once

#include "comm/communicator.h"
#include "gpu/plan_executor.h"
#include "opfuse/program.h"

namespace opfuse {

struct SessionAccess {
  // The executor under `session`; valid as long as the session.
  static gpu::SequenceExecutor& executor(Session& session);
  // The communicator of a tensor-parallel session; nullptr for one rank.
  static comm::Communicator* communicator(Session& session);
};

}  // namespace opfuse
