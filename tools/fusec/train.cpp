// `fusec train FILE --bind tokens=N --steps K --recipe R ...`: a convergence run of each recipe
// against BF16 (issue 18): a student learns a fixed random bf16 teacher's outputs plus noise from
// fresh seeded batches, recipe after recipe from the same parameters and data, on the GPU
// (run/gpu_train.h) or the CPU reference (reference/train_driver.h); prints the held-out loss
// curves and each recipe's final loss against bf16's, and writes them as JSON.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "gpu/device.h"
#include "opfuse/program.h"
#include "reference/train_driver.h"
#include "run/gpu_train.h"

namespace opfuse::fusec {

namespace {

struct TrainCommandOptions {
  std::string file;
  std::string sequence;
  std::vector<std::string> recipes;
  std::string device = "auto";
  std::vector<std::string> binds;
  std::string json;
  int steps = 1000;
  int eval_every = 0;  // 0: steps / 20
  uint64_t seed = 0;
  double lr = 1.0;
  double momentum = 0;
  double noise = 0.5;
};

constexpr const char* kBf16 = "bf16";

// The program's sequence under one recipe; nullopt after printing why not.
struct Loaded {
  ir::Program program;
  const ir::Sequence* sequence = nullptr;
};

std::optional<Loaded> load_under(const TrainCommandOptions& opts, const CommonOptions& common,
                                 const std::string& recipe, SourceManager& sources) {
  CommonOptions with_recipe = common;
  with_recipe.recipe = recipe;
  Loaded loaded;
  auto program = load(opts.file, with_recipe, sources);
  if (!program) return std::nullopt;
  loaded.program = std::move(*program);
  std::string names;
  for (const auto& s : loaded.program.sequences) names += " " + s.name;
  if (!opts.sequence.empty()) {
    loaded.sequence = loaded.program.find_sequence(opts.sequence);
    if (!loaded.sequence) {
      std::fprintf(stderr, "fusec: error: no sequence '%s' in %s; sequences:%s\n",
                   opts.sequence.c_str(), opts.file.c_str(), names.c_str());
      return std::nullopt;
    }
  } else if (loaded.program.sequences.size() == 1) {
    loaded.sequence = &loaded.program.sequences[0];
  } else {
    std::fprintf(stderr, "fusec: error: %s has %zu sequences; pick one with --sequence NAME:%s\n",
                 opts.file.c_str(), loaded.program.sequences.size(), names.c_str());
    return std::nullopt;
  }
  if (loaded.sequence->parallel.active()) {
    std::fprintf(stderr,
                 "fusec: error: sequence '%s' is tensor-parallel; fusec train runs one-rank "
                 "sequences\n",
                 loaded.sequence->name.c_str());
    return std::nullopt;
  }
  return loaded;
}

// --recipe as given, else bf16 and every declared recipe; bf16 first when missing (the
// comparison needs it); duplicates dropped.
std::vector<std::string> recipe_list(const TrainCommandOptions& opts, const ir::Program& program) {
  std::vector<std::string> given = opts.recipes;
  if (given.empty())
    for (const ir::Recipe& r : program.recipes) given.push_back(r.name);
  std::vector<std::string> out{kBf16};
  for (const std::string& r : given)
    if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  return out;
}

std::string format_loss(double loss) {
  return std::isfinite(loss) ? fmt::format("{:.6f}", loss) : std::string("nan");
}

std::string format_report(const std::vector<cpu::TrainCurve>& curves) {
  const cpu::TrainCurve& bf16 = curves.front();
  std::string out = fmt::format("{:>7}", "step");
  for (const cpu::TrainCurve& c : curves) out += fmt::format("  {:>14}", c.recipe);
  out += "\n";
  // Every curve evaluates at the same steps until it stops; bf16's never stop earlier than the
  // longest, except when it diverged: take the longest.
  const cpu::TrainCurve* longest = &bf16;
  for (const cpu::TrainCurve& c : curves)
    if (c.steps.size() > longest->steps.size()) longest = &c;
  for (std::size_t i = 0; i < longest->steps.size(); ++i) {
    out += fmt::format("{:>7}", longest->steps[i]);
    for (const cpu::TrainCurve& c : curves)
      out += fmt::format("  {:>14}", i < c.eval_loss.size() ? format_loss(c.eval_loss[i]) : "-");
    out += "\n";
  }
  out += "\nfinal eval loss (change vs bf16):\n";
  for (const cpu::TrainCurve& c : curves) {
    if (c.diverged) {
      out +=
          fmt::format("  {:<14} diverged: non-finite loss at step {}\n", c.recipe, c.diverged_step);
      continue;
    }
    const double last = c.eval_loss.back();
    std::string vs = "";
    if (&c != &bf16 && !bf16.diverged)
      vs = fmt::format("  {:+.2f}%", 100.0 * (last / bf16.eval_loss.back() - 1.0));
    out += fmt::format("  {:<14} {}{:<10}  {}\n", c.recipe, format_loss(last), vs, c.recipe_text);
  }
  // The same weights with the forward in bf16: a recipe's training apart from its forward's
  // quantization at evaluation (reference/train_driver.h, TrainCurve::final_bf16_forward_loss).
  out += "\nfinal weights, eval loss with the forward in bf16 (change vs bf16):\n";
  for (const cpu::TrainCurve& c : curves) {
    if (c.diverged) continue;
    std::string vs = "";
    if (&c != &bf16 && !bf16.diverged)
      vs = fmt::format("  {:+.2f}%",
                       100.0 * (c.final_bf16_forward_loss / bf16.final_bf16_forward_loss - 1.0));
    out += fmt::format("  {:<14} {}{}\n", c.recipe, format_loss(c.final_bf16_forward_loss), vs);
  }
  return out;
}

nlohmann::json curves_json(const TrainCommandOptions& opts, const std::string& sequence,
                           const std::string& device, const cpu::TrainOptions& train,
                           const std::vector<cpu::TrainCurve>& curves) {
  nlohmann::json bindings = nlohmann::json::object();
  for (const auto& [name, size] : train.bindings) bindings[name] = size;
  nlohmann::json out = {
      {"command", "fusec train"},
      {"file", opts.file},
      {"sequence", sequence},
      {"device", device},
      {"settings",
       {{"bindings", bindings},
        {"steps", train.steps},
        {"eval_every", train.eval_every},
        {"lr", train.lr},
        {"momentum", train.momentum},
        {"noise", train.noise},
        {"seed", train.seed}}},
      {"teacher", {{"recipe", kBf16}, {"seed", train.seed + 1}}},
      {"recipes", nlohmann::json::array()},
  };
  const cpu::TrainCurve& bf16 = curves.front();
  out["teacher"]["output_rms"] = bf16.teacher_rms;
  out["noise_floor"] = bf16.noise_floor;
  for (const cpu::TrainCurve& c : curves) {
    nlohmann::json r = {{"name", c.recipe},
                        {"recipe", c.recipe_text},
                        {"steps", c.steps},
                        {"eval_loss", c.eval_loss},  // a non-finite value is written as null
                        {"train_loss", c.train_loss},
                        {"diverged", c.diverged},
                        {"diverged_step", nullptr},
                        {"final_eval_loss", nullptr},
                        {"vs_bf16_percent", nullptr},
                        {"seconds", c.seconds},
                        {"final_bf16_forward_loss", nullptr},
                        {"bf16_forward_vs_bf16_percent", nullptr}};
    if (c.diverged) r["diverged_step"] = c.diverged_step;
    if (!c.diverged) {
      r["final_eval_loss"] = c.eval_loss.back();
      r["final_bf16_forward_loss"] = c.final_bf16_forward_loss;
    }
    if (!c.diverged && !bf16.diverged) {
      r["vs_bf16_percent"] = 100.0 * (c.eval_loss.back() / bf16.eval_loss.back() - 1.0);
      r["bf16_forward_vs_bf16_percent"] =
          100.0 * (c.final_bf16_forward_loss / bf16.final_bf16_forward_loss - 1.0);
    }
    out["recipes"].push_back(std::move(r));
  }
  return out;
}

int run_train(const TrainCommandOptions& opts, const CommonOptions& common) {
  cpu::TrainOptions train;
  const auto bindings = parse_bindings(opts.binds);
  if (!bindings) return kExitUsage;
  train.bindings.insert(bindings->begin(), bindings->end());
  train.steps = opts.steps;
  train.eval_every = opts.eval_every > 0 ? opts.eval_every : std::max(1, opts.steps / 20);
  train.seed = opts.seed;
  train.lr = opts.lr;
  train.momentum = opts.momentum;
  train.noise = opts.noise;
  if (!std::isfinite(opts.lr) || opts.lr <= 0) {
    std::fprintf(stderr, "fusec: error: --lr must be a positive number, got %g\n", opts.lr);
    return kExitUsage;
  }
  if (!std::isfinite(opts.noise) || opts.noise < 0) {
    std::fprintf(stderr, "fusec: error: --noise must be a number >= 0, got %g\n", opts.noise);
    return kExitUsage;
  }

  // Every recipe is loaded (and checked) before the first one trains.
  SourceManager sources;
  const auto teacher = load_under(opts, common, kBf16, sources);
  if (!teacher) return kExitUserError;
  const std::vector<std::string> recipes = recipe_list(opts, teacher->program);
  std::vector<Loaded> students;
  for (const std::string& recipe : recipes) {
    auto loaded = load_under(opts, common, recipe, sources);
    if (!loaded) return kExitUserError;
    students.push_back(std::move(*loaded));
  }
  const std::string sequence = teacher->sequence->name;

  std::string no_gpu;
  const bool on_gpu =
      opts.device == "gpu" || (opts.device == "auto" && gpu::gpu_available(&no_gpu));
  if (opts.device == "auto" && !on_gpu)
    std::fprintf(stderr, "fusec: no GPU (%s): training on the CPU reference\n", no_gpu.c_str());
  if (opts.device == "gpu" && !gpu::gpu_available(&no_gpu)) {
    std::fprintf(stderr,
                 "fusec: error: --device gpu: %s; use --device cpu (the CPU reference executor)\n",
                 no_gpu.c_str());
    return kExitUserError;
  }
  std::string device = "cpu (reference executor)";
  if (on_gpu) {
    const gpu::DeviceInfo info = gpu::current_device();
    device = fmt::format("{} ({})", info.name, info.arch);
  }
  std::string binds;
  for (const auto& [name, size] : train.bindings) binds += fmt::format(" {}={}", name, size);
  std::printf(
      "fusec train %s: sequence %s on %s\nbindings%s  steps %d  eval every %d  lr %g  momentum "
      "%g  noise %g  seed %llu\n",
      opts.file.c_str(), sequence.c_str(), device.c_str(),
      binds.empty() ? " (none)" : binds.c_str(), train.steps, train.eval_every, train.lr,
      train.momentum, train.noise, static_cast<unsigned long long>(train.seed));
  std::fflush(stdout);

  std::vector<cpu::TrainCurve> curves;
  try {
    std::optional<Program> teacher_program;
    for (std::size_t i = 0; i < recipes.size(); ++i) {
      auto progress = [&](int step, double eval, double loss) {
        std::fprintf(stderr, "fusec: %s: step %d  eval loss %s  train loss %s\n",
                     recipes[i].c_str(), step, format_loss(eval).c_str(),
                     format_loss(loss).c_str());
      };
      cpu::TrainCurve curve;
      if (on_gpu) {
        CompileOptions compile;
        compile.recipe = kBf16;
        if (!teacher_program) teacher_program = Program::compile_file(opts.file, compile);
        compile.recipe = recipes[i];
        const Program student = Program::compile_file(opts.file, compile);
        curve = api::train_on_gpu(student, *teacher_program, sequence, train, progress);
      } else {
        curve = cpu::train_reference(*students[i].sequence, *teacher->sequence, train, progress);
      }
      curve.recipe = recipes[i];
      // Timings on stderr: stdout is the same text for the same settings.
      std::fprintf(stderr, "fusec: %s: %d steps in %.1f s\n", recipes[i].c_str(),
                   curve.diverged ? curve.diverged_step : train.steps, curve.seconds);
      curves.push_back(std::move(curve));
    }
  } catch (const CompileError& e) {
    std::fputs(e.what(), stderr);
    return kExitUserError;
  } catch (const Error& e) {
    std::fprintf(stderr, "fusec: error: %s\n", e.what());
    return kExitUserError;
  }
  const cpu::TrainCurve& first = curves.front();
  std::printf(
      "teacher: %s recipe, parameters from seed %llu, output rms %.4f; noise floor %.6f\n\n", kBf16,
      static_cast<unsigned long long>(train.seed) + 1, first.teacher_rms, first.noise_floor);
  std::fputs(format_report(curves).c_str(), stdout);
  std::fflush(stdout);
  if (!opts.json.empty() &&
      !write_output(opts.json, curves_json(opts, sequence, device, train, curves).dump(1) + "\n"))
    return kExitUserError;
  for (const cpu::TrainCurve& c : curves) {
    if (!c.diverged) continue;
    std::fprintf(stderr, "fusec: error: recipe '%s' diverged: non-finite loss at step %d\n",
                 c.recipe.c_str(), c.diverged_step);
    return kExitUserError;
  }
  return kExitOk;
}

}  // namespace

Command add_train_command(CLI::App& app, CommonOptions& common) {
  auto opts = std::make_shared<TrainCommandOptions>();
  CLI::App* train = app.add_subcommand(
      "train",
      "convergence run: train a sequence under each recipe against a fixed random bf16 teacher "
      "(plus noise) from the same seeded parameters and batches, on the GPU or the CPU reference; "
      "print the held-out loss curves and each final loss against bf16's");
  train->add_option("file", opts->file, ".fuse file")->required()->check(CLI::ExistingFile);
  train->add_option("--sequence", opts->sequence,
                    "the sequence to train (needed when the file has several)");
  train
      ->add_option("--recipe", opts->recipes,
                   "a declared recipe or bf16 (repeatable; default: bf16 and every declared "
                   "recipe); bf16 always runs first, as the reference")
      ->allow_extra_args(false);
  train
      ->add_option("--device", opts->device,
                   "gpu, cpu (the reference executor) or auto (the GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}))
      ->capture_default_str();
  train->add_option("--bind", opts->binds, "NAME=SIZE for a symbolic dimension (repeatable)")
      ->allow_extra_args(false);
  train->add_option("--steps", opts->steps, "training steps (SGD updates)")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  train
      ->add_option("--eval-every", opts->eval_every,
                   "evaluate every E steps (and after the last); default steps / 20")
      ->check(CLI::Range(1, 10000000));
  train
      ->add_option("--seed", opts->seed,
                   "seed of the student's parameters and the data (the teacher's: seed + 1)")
      ->capture_default_str();
  train->add_option("--lr", opts->lr, "SGD learning rate")->capture_default_str();
  train->add_option("--momentum", opts->momentum, "SGD momentum (heavy ball; 0: plain SGD)")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  train->add_option("--noise", opts->noise, "standard deviation of the target noise")
      ->capture_default_str();
  train->add_option("--json", opts->json,
                    "write the curves as JSON (device, settings, per-recipe arrays) to this file");
  train->add_flag("--Werror", common.warnings_as_errors, "treat warnings as errors");
  train->footer(
      std::string(
          "Each step draws a fresh batch x ~ N(0, 1) (counter-based: step k's batch is the same "
          "for every recipe and device); target = teacher(x) + N(0, noise^2), the teacher being "
          "the sequence under bf16 with parameters from seed + 1, weight matrices rescaled to "
          "rms 1/sqrt(fan_in) and the last one to output rms 1; loss = 0.5 * mean((y - "
          "target)^2); SGD over fp32 master weights, then the quantizers' step. The eval loss is "
          "on a held-out batch with its own noise; its floor is 0.5 * noise^2. Student "
          "parameters as fusec run draws them (norm weights 1, biases 0), the weight matrices "
          "then rescaled as the teacher's. A recipe whose loss turns non-finite stops and is "
          "reported; the command "
          "then exits 1.\n") +
      kExitCodeHelp);
  return {train, [opts, &common] { return run_train(*opts, common); }};
}

}  // namespace opfuse::fusec
