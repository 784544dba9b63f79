#include "api/build_dir.h"

#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "jit/sha256.h"

namespace opfuse::api {

namespace {

using Json = nlohmann::ordered_json;

std::string sha256_hex(std::string_view bytes) {
  jit::Sha256 hasher;
  hasher.update(bytes);
  return jit::to_hex(hasher.finish());
}

std::string read_file(const std::string& path, const std::string& dir) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError(
        fmt::format("cannot read {}: is {} a `fusec build` output directory? build "
                    "it with `fusec build FILE -o {}`",
                    path, dir, dir));
  }
  return std::string{std::istreambuf_iterator<char>(in), {}};
}

[[noreturn]] void damaged(const std::string& dir, const std::string& what) {
  throw UsageError(fmt::format("{} cannot be loaded: {}; rebuild it with `fusec build FILE -o {}`",
                               dir, what, dir));
}

}  // namespace

std::string build_manifest_text(const plan::Plan& plan, const std::string& plan_json,
                                const std::vector<jit::CompiledKernel>& kernels) {
  Json list = Json::array();
  for (std::size_t i = 0; i < plan.kernels.size(); ++i) {
    const jit::CompiledKernel& k = kernels.at(i);
    std::string_view binary(k.binary.data(), k.binary.size());
    if (k.is_ptx && !binary.empty() && binary.back() == '\0') binary.remove_suffix(1);
    Json names = Json::object();
    for (const auto& [expression, lowered] : k.lowered_names) names[expression] = lowered;
    list.push_back({{"id", plan.kernels[i].id},
                    {"file", "kernels/" + plan.kernels[i].id + (k.is_ptx ? ".ptx" : ".cubin")},
                    {"bytes", binary.size()},
                    {"sha256", sha256_hex(binary)},
                    {"is_ptx", k.is_ptx},
                    {"lowered_names", names}});
  }
  const Json manifest{{"format", "opfuse-build"},
                      {"version", kBuildManifestVersion},
                      {"arch", plan.arch},
                      {"plan_sha256", sha256_hex(plan_json)},
                      {"kernels", list}};
  return manifest.dump(2) + "\n";
}

LoadedBuild load_build_dir(const std::string& dir) {
  const std::string manifest_text = read_file(dir + "/kernels.json", dir);
  const std::string plan_text = read_file(dir + "/plan.json", dir);
  Json manifest;
  LoadedBuild build;
  try {
    manifest = Json::parse(manifest_text);
    if (manifest.at("format") != "opfuse-build") damaged(dir, "kernels.json is not a manifest");
    if (manifest.at("version").get<int>() != kBuildManifestVersion) {
      damaged(dir, fmt::format("kernels.json is version {}, this opfuse reads {}",
                               manifest.at("version").get<int>(), kBuildManifestVersion));
    }
    if (manifest.at("plan_sha256").get<std::string>() != sha256_hex(plan_text))
      damaged(dir, "plan.json changed after the build (its SHA-256 differs from kernels.json's)");
    build.plan = plan::plan_from_json(Json::parse(plan_text));
  } catch (const nlohmann::json::exception& e) {
    damaged(dir, fmt::format("malformed JSON: {}", e.what()));
  } catch (const std::invalid_argument& e) {
    damaged(dir, fmt::format("plan.json: {}", e.what()));
  }
  const Json& entries = manifest.at("kernels");
  if (!entries.is_array() || entries.size() != build.plan.kernels.size())
    damaged(dir, "kernels.json does not list the plan's kernels");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Json& entry = entries[i];
    const plan::Kernel& kernel = build.plan.kernels[i];
    try {
      if (entry.at("id") != kernel.id)
        damaged(dir, fmt::format("kernels.json lists {} where the plan has {}",
                                 entry.at("id").get<std::string>(), kernel.id));
      const std::string file = entry.at("file").get<std::string>();
      const std::string bytes = read_file(fmt::format("{}/{}", dir, file), dir);
      if (bytes.size() != entry.at("bytes").get<std::size_t>() ||
          sha256_hex(bytes) != entry.at("sha256").get<std::string>())
        damaged(dir,
                fmt::format("{} is not the file the build wrote (size or SHA-256 differ)", file));
      jit::CompiledKernel compiled;
      compiled.kernel_name = kernel.id;
      compiled.arch = build.plan.arch;
      compiled.is_ptx = entry.at("is_ptx").get<bool>();
      compiled.binary.assign(bytes.begin(), bytes.end());
      if (compiled.is_ptx) compiled.binary.push_back('\0');
      compiled.lowered_names = entry.at("lowered_names").get<std::map<std::string, std::string>>();
      if (!compiled.lowered_names.contains(kernel.name_expression))
        damaged(dir, fmt::format("kernels.json has no entry name for {}", kernel.name_expression));
      compiled.cache_hit = true;
      build.kernels.push_back(std::move(compiled));
    } catch (const nlohmann::json::exception& e) {
      damaged(dir, fmt::format("kernels.json entry {}: {}", i, e.what()));
    }
  }
  return build;
}

}  // namespace opfuse::api
