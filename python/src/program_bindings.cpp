// `opfuse._opfuse.Program` and `CompileOptions`: compiling a .fuse program (the embedding API's
// Program::compile / compile_file / load_build) and the front end's IR for CPU sessions.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fstream>
#include <sstream>

#include "bindings.h"
#include "driver/compile.h"
#include "support/diagnostics.h"

namespace opfuse::python {

const ir::Sequence& PyProgram::reference_sequence(const std::string& sequence) {
  if (!front_end) {
    if (path.empty() && source.empty()) {
      throw UsageError(
          "this program was loaded from a `fusec build` directory, which holds no .fuse source: "
          "compile the .fuse file to run it on the CPU reference");
    }
    // The same front end Program::compile ran (it keeps no IR): the CPU reference lowers the
    // sequence itself, as `fusec run --device cpu` does.
    SourceManager sources;
    DiagnosticEngine diags(sources);
    driver::CompileOptions options;
    options.recipe = recipe;
    options.last_stage = driver::Stage::FrontEnd;
    driver::CompileResult result =
        path.empty() ? driver::compile_source(name, source, sources, diags, options)
                     : driver::compile_file(path, sources, diags, options);
    if (!result.ok()) throw CompileError(result.error.empty() ? diags.format_all() : result.error);
    front_end = std::make_shared<const ir::Program>(std::move(result.program));
  }
  if (sequence.empty() && front_end->sequences.size() == 1) return front_end->sequences[0];
  if (const ir::Sequence* found = front_end->find_sequence(sequence)) return *found;
  std::vector<std::string> names;
  for (const ir::Sequence& s : front_end->sequences) names.push_back(s.name);
  if (sequence.empty()) {
    throw UsageError(fmt::format("{} has {} sequences; name one: {}", name, names.size(),
                                 fmt::join(names, ", ")));
  }
  throw UsageError(
      fmt::format("no sequence '{}' in {}; sequences: {}", sequence, name, fmt::join(names, ", ")));
}

namespace {

void set_debug_config(CompileOptions& options, const std::optional<std::string>& path,
                      const std::optional<std::string>& text) {
  if (path) options.debug_config = DebugConfigSource{*path, {}, {}};
  if (text) options.debug_config = DebugConfigSource{{}, *text, "debug.yaml"};
}

}  // namespace

void bind_program(nb::module_& m) {
  nb::class_<FusionDeclaration> fusion(
      m, "FusionDeclaration",
      "A fusion pattern declared beside the program's own `fusion` declarations (docs/language.md, "
      "'Declared fusions'): op names in dataflow order, 'bias?' for an optional step.");
  nb::enum_<FusionDeclaration::Phase>(fusion, "Phase")
      .value("FORWARD", FusionDeclaration::Phase::Forward)
      .value("BACKWARD", FusionDeclaration::Phase::Backward);
  fusion
      .def(
          "__init__",
          [](FusionDeclaration* self, std::string name, std::vector<std::string> ops,
             FusionDeclaration::Phase phase, int priority) {
            new (self) FusionDeclaration{std::move(name), phase, priority, std::move(ops)};
          },
          nb::arg("name"), nb::arg("ops"), nb::arg("phase") = FusionDeclaration::Phase::Forward,
          nb::arg("priority") = 1)
      .def_rw("name", &FusionDeclaration::name)
      .def_rw("ops", &FusionDeclaration::ops)
      .def_rw("phase", &FusionDeclaration::phase)
      .def_rw("priority", &FusionDeclaration::priority,
              "> 0: tried before the built-in patterns (priority 0); < 0: after them");

  nb::class_<CompileOptions>(m, "CompileOptions", "How opfuse.compile() compiles a program.")
      .def(nb::init<>())
      .def_rw("recipe", &CompileOptions::recipe,
              "a recipe declared in the file, or 'bf16'; empty: each sequence's own")
      .def_rw("arch", &CompileOptions::arch,
              "NVRTC target ('sm_90a'); empty: the current GPU's, or sm_90a without one")
      .def_rw("cache_dir", &CompileOptions::cache_dir,
              "kernel cache; empty: $OPFUSE_CACHE_DIR, else ~/.cache/opfuse")
      .def_rw("use_cache", &CompileOptions::use_cache)
      .def_rw("disabled_passes", &CompileOptions::disabled_passes,
              "pass names, as `fusec ir --disable-pass`")
      .def_rw("fp8_fprop_fast_accum", &CompileOptions::fp8_fprop_fast_accum)
      .def_rw("fp8_backward_fast_accum", &CompileOptions::fp8_backward_fast_accum)
      .def_rw("compile_threads", &CompileOptions::compile_threads, "<= 0: every core")
      .def_rw("emulate_block_scaling", &CompileOptions::emulate_block_scaling,
              "float8_block_scaling emulated on sm_90a too (BF16 GEMMs over decoded copies)")
      .def_rw("fusions", &CompileOptions::fusions,
              "fusion patterns beside the program's own `fusion` declarations");

  nb::class_<PyProgram>(m, "Program",
                        "A compiled program: every sequence's plan and its kernels' binaries.\n\n"
                        "Made by opfuse.compile() or opfuse.load_build(); immutable, many "
                        "sessions may share one.")
      .def_static(
          "compile_file",
          [](const std::string& path, const CompileOptions& options,
             const std::optional<std::string>& debug_config_path,
             const std::optional<std::string>& debug_config_text) {
            CompileOptions with_debug = options;
            set_debug_config(with_debug, debug_config_path, debug_config_text);
            nb::gil_scoped_release release;
            return PyProgram{
                Program::compile_file(path, with_debug), path, {}, path, options.recipe, nullptr};
          },
          nb::arg("path"), nb::arg("options"), nb::arg("debug_config_path").none(),
          nb::arg("debug_config_text").none(),
          "Compiles a .fuse file (opfuse.compile() is the front to use).")
      .def_static(
          "compile_source",
          [](const std::string& source, const std::string& name, const CompileOptions& options,
             const std::optional<std::string>& debug_config_path,
             const std::optional<std::string>& debug_config_text) {
            CompileOptions with_debug = options;
            set_debug_config(with_debug, debug_config_path, debug_config_text);
            nb::gil_scoped_release release;
            return PyProgram{Program::compile(source, name, with_debug),
                             {},
                             source,
                             name,
                             options.recipe,
                             nullptr};
          },
          nb::arg("source"), nb::arg("name"), nb::arg("options"),
          nb::arg("debug_config_path").none(), nb::arg("debug_config_text").none(),
          "Compiles .fuse text; `name` is the file name diagnostics show.")
      .def_static(
          "load_build",
          [](const std::string& dir) {
            nb::gil_scoped_release release;
            return PyProgram{Program::load_build(dir), {}, {}, dir, {}, nullptr};
          },
          nb::arg("dir"),
          "A `fusec build FILE -o DIR` output, verified against DIR/kernels.json; no NVRTC. GPU "
          "sessions only (it holds no .fuse source for the CPU reference).")
      .def_prop_ro("sequences", [](const PyProgram& p) { return p.program.sequences(); })
      .def_prop_ro(
          "arch", [](const PyProgram& p) { return p.program.arch(); },
          "the NVRTC target the kernels were compiled for")
      .def(
          "recipe",
          [](const PyProgram& p, const std::string& sequence) {
            return p.program.recipe(sequence);
          },
          nb::arg("sequence") = "",
          "The recipe a sequence compiled with, e.g. 'delayed_scaling(format = hybrid, ...)'.")
      .def_prop_ro(
          "plan_json", [](const PyProgram& p) { return p.program.plan_json(); },
          "the plan as JSON (docs/codegen.md)")
      .def_prop_ro("build_stats", [](const PyProgram& p) { return p.program.build_stats(); })
      .def_prop_ro(
          "warnings", [](const PyProgram& p) { return p.program.warnings(); },
          "the compile's warnings, formatted like errors; empty when none")
      .def_prop_ro("has_debug_config",
                   [](const PyProgram& p) { return p.program.has_debug_config(); })
      .def(
          "signature",
          [](PyProgram& p, const std::string& sequence) {
            const ir::Sequence& seq = p.reference_sequence(sequence);
            std::vector<std::string> inputs;
            std::vector<std::string> outputs;
            for (ir::ValueId id : seq.inputs) inputs.push_back(seq.value(id).name);
            for (const ir::SequenceOutput& output : seq.outputs) outputs.push_back(output.name);
            return std::make_pair(inputs, outputs);
          },
          nb::arg("sequence") = "",
          "A sequence's input and output names in signature order (the main one first); "
          "UsageError for a program from load_build(), which holds no source.")
      .def_prop_ro(
          "name", [](const PyProgram& p) { return p.name; },
          "the file (or the name given to the text) it was compiled from");
}

}  // namespace opfuse::python
