// Import loading: dependency order, load-once identity, cycles, missing and non-regular files,
// the depth limit, and in-memory roots.
#include "dsl/module_loader.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/diagnostics.h"
#include "support/source_manager.h"
#include "test_support.h"

namespace opfuse::dsl {
namespace {

namespace fs = std::filesystem;

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

class Loaded {
 public:
  explicit Loaded(const std::string& root) { result = load_modules(root, sources, diags); }
  Loaded(std::string name, std::string text) {
    result = load_modules_from_source(std::move(name), std::move(text), sources, diags);
  }
  // The loaded files' base names, in load order.
  std::vector<std::string> order() const {
    std::vector<std::string> out;
    for (const auto& module : result.modules) out.push_back(sources.base_name(module->file));
    return out;
  }
  // Diagnostics as "base:line:col: message", or just the message when it has no location.
  std::vector<std::string> errors() const {
    std::vector<std::string> out;
    for (const Diagnostic& d : diags.diagnostics()) {
      if (d.loc.file == kNoFile) {
        out.push_back(d.message);
      } else {
        out.push_back(sources.base_name(d.loc.file) + ":" + std::to_string(d.loc.line) + ":" +
                      std::to_string(d.loc.col) + ": " + d.message);
      }
    }
    return out;
  }

  SourceManager sources;
  DiagnosticEngine diags{sources};
  LoadedModules result;
};

using Strings = std::vector<std::string>;

TEST(ModuleLoader, DiamondLoadsEachFileOnceInDependencyOrder) {
  const std::string dir = test::make_temp_dir("loader-diamond");
  write_file(dir + "/root.fuse", "import \"a.fuse\"\nimport \"lib/b.fuse\"\nconst r = 1\n");
  write_file(dir + "/a.fuse", "import \"lib/common.fuse\"\nconst a = 1\n");
  // b names common.fuse by another spelling; identity is the canonical path.
  write_file(dir + "/lib/b.fuse", "import \"../lib/./common.fuse\"\nconst b = 1\n");
  write_file(dir + "/lib/common.fuse", "const common = 1\n");
  Loaded loaded(dir + "/root.fuse");
  EXPECT_EQ(loaded.errors(), Strings{});
  EXPECT_EQ(loaded.order(), (Strings{"common.fuse", "a.fuse", "b.fuse", "root.fuse"}));
  EXPECT_EQ(loaded.sources.file_count(), 4u);
  EXPECT_EQ(loaded.sources.name(loaded.result.modules[0]->file), dir + "/lib/common.fuse");
}

TEST(ModuleLoader, AbsoluteImportPath) {
  const std::string dir = test::make_temp_dir("loader-absolute");
  write_file(dir + "/x/other.fuse", "const o = 1\n");
  write_file(dir + "/root.fuse", "import \"" + dir + "/x/other.fuse\"\n");
  Loaded loaded(dir + "/root.fuse");
  EXPECT_EQ(loaded.errors(), Strings{});
  EXPECT_EQ(loaded.order(), (Strings{"other.fuse", "root.fuse"}));
}

TEST(ModuleLoader, TwoFileCycleIsReportedAtTheClosingImport) {
  const std::string dir = test::make_temp_dir("loader-cycle2");
  write_file(dir + "/a.fuse", "import \"b.fuse\"\nconst a = 1\n");
  write_file(dir + "/b.fuse", "const b = 1\n  import \"a.fuse\"\n");
  Loaded loaded(dir + "/a.fuse");
  EXPECT_EQ(loaded.errors(), Strings{"b.fuse:2:10: import cycle: a.fuse -> b.fuse -> a.fuse"});
  // Loading went on without following the cycle.
  EXPECT_EQ(loaded.order(), (Strings{"b.fuse", "a.fuse"}));
}

TEST(ModuleLoader, ThreeFileCycleNamesEveryFileInOrder) {
  const std::string dir = test::make_temp_dir("loader-cycle3");
  write_file(dir + "/root.fuse", "import \"a.fuse\"\n");
  write_file(dir + "/a.fuse", "import \"b.fuse\"\n");
  write_file(dir + "/b.fuse", "import \"c.fuse\"\n");
  write_file(dir + "/c.fuse", "const c = 1\nimport \"./a.fuse\"\n");
  Loaded loaded(dir + "/root.fuse");
  EXPECT_EQ(loaded.errors(),
            Strings{"c.fuse:2:8: import cycle: a.fuse -> b.fuse -> c.fuse -> a.fuse"});
  EXPECT_EQ(loaded.order(), (Strings{"c.fuse", "b.fuse", "a.fuse", "root.fuse"}));
}

TEST(ModuleLoader, SelfImportIsACycle) {
  const std::string dir = test::make_temp_dir("loader-self");
  write_file(dir + "/a.fuse", "import \"a.fuse\"\n");
  Loaded loaded(dir + "/a.fuse");
  EXPECT_EQ(loaded.errors(), Strings{"a.fuse:1:8: import cycle: a.fuse -> a.fuse"});
  EXPECT_EQ(loaded.order(), Strings{"a.fuse"});
}

TEST(ModuleLoader, MissingImportNamesThePathTriedAndTheReason) {
  const std::string dir = test::make_temp_dir("loader-missing");
  write_file(dir + "/root.fuse", "import \"nope.fuse\"\nimport \"ok.fuse\"\n");
  write_file(dir + "/ok.fuse", "const ok = 1\n");
  Loaded loaded(dir + "/root.fuse");
  EXPECT_EQ(loaded.errors(), Strings{"root.fuse:1:8: cannot open '" + dir +
                                     "/nope.fuse': No such file or directory"});
  EXPECT_EQ(loaded.diags.diagnostics().at(0).hint,
            "import paths are relative to the directory of the importing file");
  EXPECT_EQ(loaded.order(), (Strings{"ok.fuse", "root.fuse"}));
}

TEST(ModuleLoader, ImportingADirectoryIsAnError) {
  const std::string dir = test::make_temp_dir("loader-dir");
  fs::create_directories(dir + "/sub.fuse");
  write_file(dir + "/root.fuse", "import \"sub.fuse\"\n");
  Loaded loaded(dir + "/root.fuse");
  EXPECT_EQ(loaded.errors(), Strings{"root.fuse:1:8: cannot open '" + dir +
                                     "/sub.fuse': it is a directory, not a .fuse file"});
  EXPECT_EQ(loaded.order(), Strings{"root.fuse"});
}

TEST(ModuleLoader, ImportingAFifoIsAnErrorNotAHang) {
  const std::string dir = test::make_temp_dir("loader-fifo");
  ASSERT_EQ(::mkfifo((dir + "/pipe.fuse").c_str(), 0600), 0);
  write_file(dir + "/root.fuse", "import \"pipe.fuse\"\n");
  Loaded loaded(dir + "/root.fuse");
  EXPECT_EQ(loaded.errors(), Strings{"root.fuse:1:8: cannot open '" + dir +
                                     "/pipe.fuse': it is not a regular file"});
}

TEST(ModuleLoader, ImportDepthLimit) {
  const std::string dir = test::make_temp_dir("loader-depth");
  // f0 (the root, depth 0) imports f1 ... imports f33: f33 would be at depth 33.
  const size_t last = kMaxImportDepth + 1;
  for (size_t i = 0; i <= last; ++i) {
    const std::string next = i < last ? "import \"f" + std::to_string(i + 1) + ".fuse\"\n" : "";
    write_file(dir + "/f" + std::to_string(i) + ".fuse", next);
  }
  Loaded too_deep(dir + "/f0.fuse");
  EXPECT_EQ(too_deep.errors(),
            Strings{"f32.fuse:1:8: imports are nested too deeply (limit 32 levels)"});
  EXPECT_EQ(too_deep.result.modules.size(), kMaxImportDepth + 1);

  Loaded at_limit(dir + "/f1.fuse");  // f1 ... f33 is 32 levels below f1
  EXPECT_EQ(at_limit.errors(), Strings{});
  EXPECT_EQ(at_limit.result.modules.size(), kMaxImportDepth + 1);
  EXPECT_EQ(at_limit.order().front(), "f33.fuse");
}

TEST(ModuleLoader, MissingRootHasNoLocation) {
  const std::string dir = test::make_temp_dir("loader-root");
  Loaded loaded(dir + "/absent.fuse");
  EXPECT_EQ(loaded.errors(),
            Strings{"cannot open '" + dir + "/absent.fuse': No such file or directory"});
  EXPECT_EQ(loaded.diags.diagnostics().at(0).loc.file, kNoFile);
  EXPECT_TRUE(loaded.result.modules.empty());

  Loaded directory_root(dir);
  EXPECT_EQ(directory_root.errors(),
            Strings{"cannot open '" + dir + "': it is a directory, not a .fuse file"});
}

TEST(ModuleLoader, ParseErrorsInImportsAreReportedInTheirFile) {
  const std::string dir = test::make_temp_dir("loader-parse");
  write_file(dir + "/root.fuse", "import \"bad.fuse\"\nconst r = 1\n");
  write_file(dir + "/bad.fuse", "const = 2\n");
  Loaded loaded(dir + "/root.fuse");
  EXPECT_EQ(loaded.errors(), Strings{"bad.fuse:1:7: expected a name after 'const', found '='"});
  EXPECT_EQ(loaded.order(), (Strings{"bad.fuse", "root.fuse"}));
}

TEST(ModuleLoader, InMemoryRootResolvesImportsFromTheWorkingDirectory) {
  const std::string dir = test::make_temp_dir("loader-memory");
  write_file(dir + "/lib/dep.fuse", "const d = 1\n");
  const fs::path saved = fs::current_path();
  fs::current_path(dir);
  Loaded loaded("<stdin>", "import \"lib/dep.fuse\"\nimport \"lib/gone.fuse\"\n");
  fs::current_path(saved);
  EXPECT_EQ(loaded.errors(), Strings{"<stdin>:2:8: cannot open 'lib/gone.fuse': No such file or "
                                     "directory"});
  EXPECT_EQ(loaded.order(), (Strings{"dep.fuse", "<stdin>"}));
  EXPECT_EQ(loaded.sources.name(loaded.result.modules[0]->file), "lib/dep.fuse");
}

TEST(ModuleLoader, EmptyImportPathIsAnError) {
  Loaded loaded("m.fuse", "import \"\"\n");
  EXPECT_EQ(loaded.errors(), Strings{"m.fuse:1:8: empty import path"});
}

}  // namespace
}  // namespace opfuse::dsl
