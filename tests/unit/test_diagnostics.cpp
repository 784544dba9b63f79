// DiagnosticEngine: the exact text of a diagnostic (location, source line, caret, hint, note), the
// error cap, long lines, control bytes, several files and diagnostics without a location.
#include <gtest/gtest.h>

#include <string>

#include "support/diagnostics.h"
#include "support/source_manager.h"

namespace opfuse {
namespace {

SourceLoc at(FileId file, uint32_t line, uint32_t col) { return SourceLoc{file, line, col}; }

TEST(Diagnostics, FormatsLocationSourceLineCaretAndHint) {
  SourceManager sources;
  const FileId f = sources.add_buffer("t.fuse", "const a = 1\nconst b = a $ 2\n");
  DiagnosticEngine diags(sources);
  diags.error(at(f, 2, 13), "unexpected character '$'", "remove it");
  EXPECT_EQ(diags.format_all(),
            "t.fuse:2:13: error: unexpected character '$'\n"
            "  const b = a $ 2\n"
            "              ^\n"
            "  hint: remove it\n");
  EXPECT_EQ(diags.error_count(), 1u);
  EXPECT_TRUE(diags.has_errors());
}

TEST(Diagnostics, CaretAtColumnOneAndWithoutHint) {
  SourceManager sources;
  const FileId f = sources.add_buffer("t.fuse", "rmsnorm(64)\n");
  DiagnosticEngine diags(sources);
  diags.error(at(f, 1, 1), "expected a declaration");
  EXPECT_EQ(diags.format_all(),
            "t.fuse:1:1: error: expected a declaration\n"
            "  rmsnorm(64)\n"
            "  ^\n");
}

TEST(Diagnostics, TabsInTheLineKeepTheCaretUnderItsColumn) {
  SourceManager sources;
  const FileId f = sources.add_buffer("t.fuse", "\tlinear(a,\tb)\n");
  DiagnosticEngine diags(sources);
  diags.error(at(f, 1, 12), "unknown name 'b'");
  // The caret line copies the tabs, so a terminal expands both lines alike.
  EXPECT_EQ(diags.format(diags.diagnostics()[0]),
            "t.fuse:1:12: error: unknown name 'b'\n"
            "  \tlinear(a,\tb)\n"
            "  \t         \t^\n");
}

TEST(Diagnostics, MultiByteCharactersTakeOneCaretColumn) {
  SourceManager sources;
  // "é" is two bytes; the column counts bytes, the caret must still sit under the '$'.
  const FileId f = sources.add_buffer("t.fuse", "# é\nx = \"é\" $\n");
  DiagnosticEngine diags(sources);
  diags.error(at(f, 2, 10), "unexpected character '$'");
  EXPECT_EQ(diags.format_all(),
            "t.fuse:2:10: error: unexpected character '$'\n"
            "  x = \"é\" $\n"
            "          ^\n");
}

TEST(Diagnostics, WarningAndNoteFollowTheirError) {
  SourceManager sources;
  const FileId f = sources.add_buffer("t.fuse", "const a = 1\nconst a = 2\n");
  DiagnosticEngine diags(sources);
  diags.warning(at(f, 1, 7), "'a' is unused", "remove it");
  diags.error(at(f, 2, 7), "'a' is already defined as a constant");
  diags.note(at(f, 1, 7), "'a' was defined here");
  EXPECT_EQ(diags.format_all(),
            "t.fuse:1:7: warning: 'a' is unused\n"
            "  const a = 1\n"
            "        ^\n"
            "  hint: remove it\n"
            "t.fuse:2:7: error: 'a' is already defined as a constant\n"
            "  const a = 2\n"
            "        ^\n"
            "t.fuse:1:7: note: 'a' was defined here\n"
            "  const a = 1\n"
            "        ^\n");
  EXPECT_EQ(diags.error_count(), 1u);
  EXPECT_EQ(diags.warning_count(), 1u);
  ASSERT_EQ(diags.diagnostics().size(), 3u);
  EXPECT_EQ(diags.diagnostics()[2].severity, Severity::Note);
}

TEST(Diagnostics, WarningsAsErrorsCountAsErrors) {
  SourceManager sources;
  const FileId f = sources.add_buffer("t.fuse", "x\n");
  DiagnosticEngine diags(sources);
  diags.set_warnings_as_errors(true);
  diags.warning(at(f, 1, 1), "suspicious");
  EXPECT_EQ(diags.error_count(), 1u);
  EXPECT_EQ(diags.warning_count(), 0u);
  EXPECT_EQ(diags.format_all().rfind("t.fuse:1:1: error: suspicious\n", 0), 0u)
      << diags.format_all();
}

TEST(Diagnostics, KeepsTwentyErrorsAndCountsTheRest) {
  SourceManager sources;
  const FileId f = sources.add_buffer("t.fuse", "x\n");
  DiagnosticEngine diags(sources);
  for (int i = 1; i <= 25; ++i) {
    EXPECT_EQ(diags.at_error_limit(), i > 20) << i;
    diags.error(at(f, 1, 1), "error " + std::to_string(i));
    diags.note(at(f, 1, 1), "note " + std::to_string(i));
  }
  EXPECT_EQ(diags.error_count(), 25u);
  // 20 errors, each with its note; the notes of dropped errors are dropped too.
  ASSERT_EQ(diags.diagnostics().size(), 40u);
  EXPECT_EQ(diags.diagnostics()[38].message, "error 20");
  EXPECT_EQ(diags.diagnostics()[39].message, "note 20");
  const std::string all = diags.format_all();
  EXPECT_EQ(all.find("error 21"), std::string::npos);
  EXPECT_TRUE(all.ends_with("opfuse: note: 5 more errors not shown (limit 20)\n")) << all;
}

TEST(Diagnostics, ErrorLimitCanBeLowered) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  diags.set_error_limit(2);
  for (int i = 0; i < 3; ++i) diags.error(SourceLoc{}, "e");
  EXPECT_TRUE(diags.at_error_limit());
  EXPECT_EQ(diags.diagnostics().size(), 2u);
  EXPECT_TRUE(diags.format_all().ends_with("opfuse: note: 1 more errors not shown (limit 2)\n"));
}

TEST(Diagnostics, HugeLineIsShownAroundTheCaret) {
  std::string line(100 * 1024, 'x');
  const size_t dollar = 50000;  // 0-based byte offset: column 50001
  line[dollar] = '$';
  SourceManager sources;
  const FileId f = sources.add_buffer("big.fuse", line + "\n");
  DiagnosticEngine diags(sources);
  diags.error(at(f, 1, dollar + 1), "unexpected character '$'");
  const std::string text = diags.format_all();
  EXPECT_LT(text.size(), 500u) << "the whole 100 kB line was printed";
  // 80 bytes of context on each side, marked as cut with "..." at both ends.
  const std::string excerpt = std::string(80, 'x') + "$" + std::string(79, 'x');
  EXPECT_EQ(text,
            "big.fuse:1:50001: error: unexpected character '$'\n"
            "  ..." +
                excerpt +
                "...\n"
                "  " +
                std::string(3 + 80, ' ') + "^\n");
}

TEST(Diagnostics, HugeLineWithCaretNearItsEndShowsTheTail) {
  const std::string line(1000, 'y');
  SourceManager sources;
  const FileId f = sources.add_buffer("t.fuse", line);
  DiagnosticEngine diags(sources);
  diags.error(at(f, 1, 1001), "expected ')', found end of file");  // just past the last byte
  const std::string text = diags.format_all();
  EXPECT_EQ(text,
            "t.fuse:1:1001: error: expected ')', found end of file\n"
            "  ..." +
                std::string(160, 'y') +
                "\n"
                "  " +
                std::string(3 + 160, ' ') + "^\n");
}

TEST(Diagnostics, ColumnPastTheLineEndPutsTheCaretAfterIt) {
  SourceManager sources;
  const FileId f = sources.add_buffer("t.fuse", "abc\n" + std::string(300, 'z') + "\n");
  DiagnosticEngine diags(sources);
  diags.error(at(f, 1, 1000000), "past the end");
  diags.error(at(f, 2, 1000000), "past the end of a long line");
  diags.error(at(f, 9, 4), "line past the end of the file");
  const std::string text = diags.format_all();
  EXPECT_NE(text.find("t.fuse:1:1000000: error: past the end\n  abc\n     ^\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  ..." + std::string(160, 'z') + "\n  " + std::string(163, ' ') + "^\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("t.fuse:9:4: error: line past the end of the file\n  \n  ^\n"),
            std::string::npos)
      << text;
}

TEST(Diagnostics, ControlBytesAreReplacedAndColumnsKept) {
  SourceManager sources;
  const FileId f = sources.add_buffer(
      "bin.fuse", std::string("a\x01\x1b[31m\x7f", 8) + std::string(1, '\0') + "b $\r\n");
  DiagnosticEngine diags(sources);
  diags.error(at(f, 1, 12), "unexpected character '$'");
  // ESC, DEL, NUL and the other control bytes print as '?', one column each; '\r' before the
  // newline is not part of the line.
  EXPECT_EQ(diags.format_all(),
            "bin.fuse:1:12: error: unexpected character '$'\n"
            "  a??[31m??b $\n"
            "             ^\n");
}

TEST(Diagnostics, LocationInASecondFileNamesThatFile) {
  SourceManager sources;
  sources.add_buffer("main.fuse", "import \"lib.fuse\"\n");
  const FileId lib = sources.add_buffer("dir/lib.fuse", "const w = 64\nconst w = 65\n");
  DiagnosticEngine diags(sources);
  diags.error(at(lib, 2, 7), "'w' is already defined as a constant");
  EXPECT_EQ(diags.format_all(),
            "dir/lib.fuse:2:7: error: 'w' is already defined as a constant\n"
            "  const w = 65\n"
            "        ^\n");
}

TEST(Diagnostics, NoLocationGivesAToolPrefixedLine) {
  SourceManager sources;
  sources.add_buffer("t.fuse", "x\n");
  DiagnosticEngine diags(sources);
  diags.error(SourceLoc{}, "cannot open 'missing.fuse': No such file or directory");
  diags.warning(SourceLoc{}, "no sequences", "add one");
  // A file id that no file has is treated like no location, not an out-of-range read.
  diags.error(at(7, 1, 1), "from nowhere");
  EXPECT_EQ(diags.format_all(),
            "opfuse: error: cannot open 'missing.fuse': No such file or directory\n"
            "opfuse: warning: no sequences\n"
            "  hint: add one\n"
            "opfuse: error: from nowhere\n");
}

}  // namespace
}  // namespace opfuse
