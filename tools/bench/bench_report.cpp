// `fusec bench`'s text report and JSON (bench.h).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "bench/bench.h"

namespace opfuse::api {

namespace {

using Json = nlohmann::ordered_json;

double mib(std::size_t bytes) { return double(bytes) / double(1 << 20); }

std::string bindings_text(const std::map<std::string, std::int64_t>& bindings) {
  std::string text;
  for (const auto& [name, size] : bindings)
    text += fmt::format("{}{}={}", text.empty() ? "" : " ", name, size);
  return text.empty() ? "(none)" : text;
}

Json stats_json(const TimeStats& stats) {
  return Json{{"median", stats.median}, {"p10", stats.p10},   {"p90", stats.p90},
              {"min", stats.min},       {"mean", stats.mean}, {"samples", stats.samples}};
}

std::string step_line(const BenchStep& step, double steps_ms) {
  if (!step.ran) {
    return fmt::format("{:>4}  {:<8}  {:<6}  {:>9}  {:>6}  {:>7}  {:>6}  {:>5}  {:>7}  {}\n",
                       step.index, step.phase, step.kind, "skipped", "-", "-", "-", "-", "-",
                       step.what + (step.weight_cast ? " (cached weight cast)" : " (not run)"));
  }
  const std::string tflops = step.kind == "gemm" ? fmt::format("{:.1f}", step.tflops) : "-";
  const bool moves = step.kind == "kernel";
  const std::string gb = moves ? fmt::format("{:.0f}", step.gb_per_s) : "-";
  const std::string share = moves ? fmt::format("{:.0f}%", 100 * step.copy_share) : "-";
  return fmt::format(
      "{:>4}  {:<8}  {:<6}  {:>9.4f}  {:>5.1f}%  {:>7}  {:>6}  {:>5}  {:>7.1f}  {}\n", step.index,
      step.phase, step.kind, step.time.median,
      steps_ms > 0 ? 100 * step.time.median / steps_ms : 0.0, tflops, gb, share,
      step.host_us.median, step.what);
}

}  // namespace

std::string format_bench_report(const BenchReport& r) {
  std::string out = fmt::format(
      "fusec bench {}: sequence {}, mode {}{}, recipe {}\n"
      "device {} ({}, {} SMs, L2 {:.1f} MiB){}; bindings {}\n"
      "compile: {} kernels ({} from the cache, {} compiled), kernel stage {:.0f} ms, whole "
      "compile {:.0f} ms\n"
      "inputs rotated over {} set{} of {:.1f} MiB ({:.1f}x the L2); FP8 weights {}; GEMM "
      "algorithms: {}\n"
      "{} warm-up, {} timed iterations per pass\n\n",
      r.file, r.sequence, r.mode, r.graph ? " (CUDA graph replay)" : "", r.recipe, r.device, r.arch,
      r.sm_count, mib(r.l2_bytes),
      r.tp > 1 ? fmt::format("; tensor-parallel rank {} of {} (its own times)", r.rank, r.tp) : "",
      bindings_text(r.bindings), r.build.kernels, r.build.cache_hits, r.build.compiled,
      r.build.compile_ms, r.compile_wall_ms, r.rotation_sets, r.rotation_sets == 1 ? "" : "s",
      mib(r.input_set_bytes),
      r.l2_bytes > 0 ? double(r.rotation_sets * r.input_set_bytes) / double(r.l2_bytes) : 0.0,
      r.weights, r.gemm_algorithms, r.warmup, r.iterations);
  out += fmt::format(
      "time per iteration  median {:.4f} ms  p10 {:.4f}  p90 {:.4f}  (issued back to back)\n",
      r.time.median, r.time.p10, r.time.p90);
  out += fmt::format(
      "device-only         median {:.4f} ms  p10 {:.4f}  p90 {:.4f}  (queued behind a host "
      "hold; {:.1f} us between iterations)\n",
      r.device_time.median, r.device_time.p10, r.device_time.p90, r.device_gap_us);
  out += fmt::format("GEMM rate           {:.1f} TFLOP/s ({:.3g} GEMM flops per iteration)\n",
                     r.tflops, r.gemm_flops);
  out += fmt::format(
      "host time per call  {:.1f} us mean, {:.1f} us median (the enqueueing calls alone, no "
      "sync; {} calls)\n",
      r.host_us.mean, r.host_us.median, r.host_us.samples);
  out += fmt::format(
      "peak device memory  {:.1f} MiB = {:.1f} executor (activations, workspaces, FP8 copies) + "
      "{:.1f} parameters + {:.1f} one input set; pool high-water {:.1f} MiB\n",
      mib(r.peak_bytes), mib(r.executor_peak_bytes), mib(r.parameter_bytes), mib(r.input_set_bytes),
      mib(r.pool_high_bytes));
  out += fmt::format(
      "device copy         {:.0f} GB/s (cudaMemcpyAsync device to device of {:.0f} MiB, bytes "
      "read + written)\n",
      r.copy_gb_per_s, mib(r.copy_bytes));

  const double steps_ms = r.gemm_ms + r.kernel_ms + r.collective_ms;
  out += fmt::format(
      "\nper step (median of {} profiled iterations, eager, one event pair per "
      "step):\n",
      r.profile_iterations);
  out += fmt::format("{:>4}  {:<8}  {:<6}  {:>9}  {:>6}  {:>7}  {:>6}  {:>5}  {:>7}  {}\n", "step",
                     "phase", "kind", "ms", "share", "TFLOP/s", "GB/s", "copy", "host us", "what");
  for (const BenchStep& step : r.steps) out += step_line(step, steps_ms);
  const auto percent = [&](double ms) { return steps_ms > 0 ? 100 * ms / steps_ms : 0.0; };
  out += fmt::format(
      "GEMMs {:.4f} ms ({:.0f}%), generated kernels {:.4f} ms ({:.0f}%; {:.0f} GB/s = {:.0f}% of "
      "the copy){}; the steps sum to {:.4f} ms of the {:.4f} ms device-only iteration\n",
      r.gemm_ms, percent(r.gemm_ms), r.kernel_ms, percent(r.kernel_ms), r.kernel_gb_per_s,
      100 * r.kernel_copy_share,
      r.tp > 1 ? fmt::format(", collectives {:.4f} ms ({:.0f}%, waiting for the other ranks "
                             "included)",
                             r.collective_ms, percent(r.collective_ms))
               : "",
      steps_ms, r.device_time.median);
  for (const std::string& note : r.notes) out += "note: " + note + "\n";
  if (r.trace.iterations > 0) {
    const BenchReport::Trace& t = r.trace;
    const double per = 1.0 / t.iterations;
    out += fmt::format(
        "GPU trace           {} iterations back to back: {} activities ({} kernels), the GPU busy "
        "{:.4f} of {:.4f} ms per iteration, idle {:.4f} ms (CUPTI {}{})\n",
        t.iterations, t.activities, t.kernels, t.busy_ms * per, t.span_ms * per,
        (t.span_ms - t.busy_ms) * per, t.library,
        t.dropped > 0 ? fmt::format("; {} records dropped", t.dropped) : "");
    for (const std::string& gap : t.largest_gaps) out += "  idle " + gap + "\n";
  }
  return out;
}

std::string bench_report_json(const BenchReport& r) {
  Json steps = Json::array();
  for (const BenchStep& step : r.steps) {
    Json item{{"index", step.index},
              {"phase", step.phase},
              {"kind", step.kind},
              {"what", step.what},
              {"ran", step.ran},
              {"weight_cast", step.weight_cast},
              {"bytes_read", step.bytes_read},
              {"bytes_written", step.bytes_written}};
    if (!step.kernel.empty()) item["kernel"] = step.kernel;
    if (!step.gemm.empty()) {
      item["gemm"] = step.gemm;
      item["role"] = step.gemm_role;
      item["m"] = step.m;
      item["n"] = step.n;
      item["k"] = step.k;
      item["dtypes"] = {step.a_dtype, step.b_dtype, step.d_dtype};
      item["fast_accum"] = step.fast_accum;
      item["flops"] = step.flops;
    }
    if (step.ran) {
      item["time_ms"] = stats_json(step.time);
      item["host_us"] = stats_json(step.host_us);
      if (step.kind == "gemm") item["tflops"] = step.tflops;
      if (step.kind == "kernel") {
        item["gb_per_s"] = step.gb_per_s;
        item["copy_share"] = step.copy_share;
      }
    }
    steps.push_back(std::move(item));
  }
  Json bindings = Json::object();
  for (const auto& [name, size] : r.bindings) bindings[name] = size;
  Json json{
      {"tool", "fusec bench"},
      {"file", r.file},
      {"sequence", r.sequence},
      {"recipe", r.recipe},
      {"mode", r.mode},
      {"graph", r.graph},
      {"weights", r.weights},
      {"gemm_algorithms", r.gemm_algorithms},
      {"auto_graph", r.auto_graph},
      {"fused_epilogues", r.fused_epilogues},
      {"fused_training_epilogues", r.fused_training_epilogues},
      {"device",
       {{"name", r.device}, {"arch", r.arch}, {"sm_count", r.sm_count}, {"l2_bytes", r.l2_bytes}}},
      {"bindings", bindings},
      {"parallel", {{"tp", r.tp}, {"rank", r.rank}}},
      {"compile",
       {{"kernels", r.build.kernels},
        {"cache_hits", r.build.cache_hits},
        {"compiled", r.build.compiled},
        {"kernel_stage_ms", r.build.compile_ms},
        {"wall_ms", r.compile_wall_ms}}},
      {"warmup", r.warmup},
      {"iterations", r.iterations},
      {"rotation_sets", r.rotation_sets},
      {"input_set_bytes", r.input_set_bytes},
      {"time_ms", stats_json(r.time)},
      {"device_time_ms", stats_json(r.device_time)},
      {"device_gap_us", r.device_gap_us},
      {"gemm_flops", r.gemm_flops},
      {"tflops", r.tflops},
      {"host_us", stats_json(r.host_us)},
      {"memory",
       {{"peak_bytes", r.peak_bytes},
        {"executor_peak_bytes", r.executor_peak_bytes},
        {"parameter_bytes", r.parameter_bytes},
        {"pool_high_bytes", r.pool_high_bytes}}},
      {"copy", {{"bytes", r.copy_bytes}, {"gb_per_s", r.copy_gb_per_s}}},
      {"profile_iterations", r.profile_iterations},
      {"summary",
       {{"gemm_ms", r.gemm_ms},
        {"kernel_ms", r.kernel_ms},
        {"collective_ms", r.collective_ms},
        {"kernel_bytes", r.kernel_bytes},
        {"kernel_gb_per_s", r.kernel_gb_per_s},
        {"kernel_copy_share", r.kernel_copy_share}}},
      {"steps", steps},
      {"notes", r.notes},
  };
  if (r.trace.iterations > 0) {
    json["trace"] = {{"iterations", r.trace.iterations}, {"library", r.trace.library},
                     {"activities", r.trace.activities}, {"kernels", r.trace.kernels},
                     {"dropped", r.trace.dropped},       {"span_ms", r.trace.span_ms},
                     {"busy_ms", r.trace.busy_ms},       {"largest_gaps", r.trace.largest_gaps}};
  }
  return json.dump(1) + "\n";
}

std::string rank_trace_path(const std::string& path, int rank) {
  if (rank == 0) return path;
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  const bool has_extension =
      dot != std::string::npos && dot > 0 && (slash == std::string::npos || dot > slash + 1);
  const std::string suffix = fmt::format(".rank{}", rank);
  return has_extension ? path.substr(0, dot) + suffix + path.substr(dot) : path + suffix;
}

}  // namespace opfuse::api
