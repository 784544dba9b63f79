// `fusec train --device cpu`: a convergence run of one sequence under one recipe against a fixed
// random teacher, on the CPU reference; and the pieces the GPU loop (tools/run/gpu_train.h) shares
// with it so that both devices draw the same data, build the same teacher and update the same way.
//
// The task (why: tests/unit/test_convergence.cpp's header). A teacher, the same sequence under the
// bf16 recipe with parameters from seed + 1 and every weight matrix rescaled (teacher_weights),
// maps each step's fresh batch x ~ N(0, 1) to target = teacher(x) + N(0, noise^2); the student,
// with parameters from `seed` (plan::ParamInitializer, as `fusec run` and Session::own_parameters
// draw them) and its matrices then rescaled as the teacher's (teacher_weights), minimizes loss =
// 0.5 * mean((student(x) - target)^2) by SGD over fp32 master weights, so the run can only approach
// the noise floor 0.5 * noise^2. Step k's batch and noise are the same for every recipe and device
// (counter-based draws, fill_normal); the evaluation batch is held out.
//
// Why the student's matrices are rescaled: from TE's N(0, 0.02) a stack of SwiGLU blocks without
// residuals sits on the saddle at zero (SwiGLU is quadratic there, and each block's output is
// ~1e-3 of its input), where SGD did not move the loss in 80 steps at any stable learning rate
// (measured on train_stack.fuse, CPU). At the teacher's LeCun scale it starts from a random
// network of the same family (loss ~ 0.5 * (2 + noise^2)) and descends at once.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "reference_executor.h"

namespace opfuse::cpu {

struct TrainOptions {
  Bindings bindings;
  int steps = 1000;
  uint64_t seed = 0;
  double lr = 1.0;
  double momentum = 0;   // heavy-ball: v = momentum * v + g; w -= lr * v
  double noise = 0.5;    // standard deviation of the target noise
  int eval_every = 100;  // evaluation after steps 0, E, 2E, ... and after the last step
};

// One recipe's run: the held-out evaluation loss after each evaluated step (0 = before any update).
struct TrainCurve {
  std::string recipe;       // the recipe's name as given (--recipe)
  std::string recipe_text;  // what it expands to, e.g. "delayed_scaling(format = hybrid, ...)"
  std::vector<int> steps;   // the evaluated steps, ascending
  std::vector<double> eval_loss;
  std::vector<double> train_loss;  // the loss of the batch of each evaluated step (before its
                                   // update); at the final point, the last step's
  double noise_floor = 0;          // 0.5 * mean(noise^2) of the evaluation batch
  double teacher_rms = 0;          // root mean square of teacher(x) on the evaluation batch
  // The held-out loss of the final weights with the forward in bf16 (the teacher's recipe, the
  // same sequence): what the trained weights are worth without the recipe's quantization at
  // evaluation, which separates how well a recipe trains from how much its forward's quantization
  // adds to the loss. NaN when the run diverged.
  double final_bf16_forward_loss = std::numeric_limits<double>::quiet_NaN();
  bool diverged = false;  // a non-finite loss stopped the run
  int diverged_step = -1;
  double seconds = 0;
};

// The streams of fill_normal, per tensor role: input `index` of the batch, and its target noise.
inline constexpr uint64_t kNoiseStream = 0x6E6F697365ull;  // "noise"
inline uint64_t input_stream(size_t index) { return 1 + index; }
// The batch counter of the held-out evaluation batch (training steps count from 0).
inline constexpr uint64_t kEvalBatch = ~uint64_t{0};

// N(0, stddev) values for (seed, stream, batch): value j from a SplitMix64 hash of the four, two
// uniforms each by Box-Muller, so any batch is drawn without the ones before it, in any order and
// on any thread, the same on every platform. `out` holds values first, first + 1, ... of the
// batch (`first` even), so that threads can draw parts of one batch.
void fill_normal(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t batch,
                 double stddev, size_t first = 0);

// A parameter's values on the host, in a sequence's parameter order.
struct HostParam {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The teacher's weights: every matrix (a linear weight [out, in]) rescaled to root mean square
// 1 / sqrt(in), so each linear keeps its input's scale (LeCun); vectors (norm weights, biases)
// stay.
void teacher_weights(std::vector<HostParam>& params);
// Index of the last matrix in `params` (the one the output is linear in), or params.size().
size_t last_matrix(const std::vector<HostParam>& params);

// SGD with optional momentum over fp32 master weights: TE's practice of an fp32 optimizer copy
// behind bf16 parameters (without it, updates below bf16's resolution vanish:
// test_convergence.cpp).
class SgdOptimizer {
 public:
  SgdOptimizer(std::vector<HostParam> masters, double lr, double momentum);
  // Updates parameter `index` with its gradient and returns its new master values.
  const std::vector<float>& update(size_t index, std::span<const float> grad);
  const std::vector<HostParam>& params() const { return masters_; }

 private:
  std::vector<HostParam> masters_;
  std::vector<std::vector<float>> velocity_;
  double lr_, momentum_;
};

// The loss and dL/dy of one batch: 0.5 * mean((y - target)^2), dy = (y - target) / numel.
double loss_and_gradient(std::span<const float> y, std::span<const float> target,
                         std::span<float> dy);
double half_mean_square(std::span<const float> values);

// Whether the evaluation runs after `step` updates.
bool evaluates_after(int step, const TrainOptions& options);

// Called with each evaluated point as it is reached: (step, eval loss, train loss).
using TrainProgress = std::function<void(int, double, double)>;

// The run on the CPU reference. `student` is the sequence under the recipe to measure, `teacher`
// the same sequence under bf16. Throws ReferenceError for user errors (no parameter, no output,
// unbound sizes, steps < 1).
TrainCurve train_reference(const ir::Sequence& student, const ir::Sequence& teacher,
                           const TrainOptions& options, const TrainProgress& progress = {});

}  // namespace opfuse::cpu
