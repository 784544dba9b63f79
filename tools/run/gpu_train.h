// `fusec train --device gpu`: the CPU reference's convergence run (reference/train_driver.h) on
// the GPU through the embedding API: the same teacher, batches, noise, loss and SGD over fp32
// master weights, so the two devices' curves can be compared. The loss, dL/dy and the update are
// computed on the host (the next batch is drawn on a host thread while the GPU runs); forward,
// backward and step() run on the GPU.
#pragma once

#include <string>

#include "opfuse/program.h"
#include "reference/train_driver.h"

namespace opfuse::api {

// `student` is the program compiled under the recipe to measure, `teacher` the same file under
// bf16. Throws opfuse::Error (UsageError for a sequence without parameters or output gradient).
cpu::TrainCurve train_on_gpu(const Program& student, const Program& teacher,
                             const std::string& sequence, const cpu::TrainOptions& options,
                             const cpu::TrainProgress& progress = {});

}  // namespace opfuse::api
