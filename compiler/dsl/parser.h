// The .fuse parser: recursive descent over the lexer's tokens, building the AST of dsl/ast.h.
//
// Errors go to the DiagnosticEngine at the offending token, saying what was expected and what was
// found. The parser recovers (inside a sequence body at the next line that starts an op or at '}';
// elsewhere at the next declaration keyword) so one run reports several errors, and stops once the
// engine's error limit is reached. Input is bounded: expression nesting, list and call sizes and
// declaration counts have the limits below, each reported at the token that crosses it.
//
// Locations: declarations, params and args carry the location of their name (a positional arg:
// its value; an import: its path string); a Binary/Unary expr the location of its operator; a List
// its '['. Parentheses leave no node.
#pragma once

#include <cstddef>
#include <memory>

#include "dsl/ast.h"
#include "support/diagnostics.h"
#include "support/source_manager.h"

namespace opfuse::dsl {

// Parentheses, brackets, unary minus and chained binary operators all count as one level each, so
// the tree depth (and the recursion that walks it) stays bounded.
inline constexpr size_t kMaxExprNesting = 64;
inline constexpr size_t kMaxOpsPerSequence = 4096;
inline constexpr size_t kMaxParamsPerSignature = 256;
inline constexpr size_t kMaxFusionSteps = 16;  // steps of one fusion declaration
inline constexpr size_t kMaxDimsPerType = 64;
inline constexpr size_t kMaxArgsPerCall = 256;
inline constexpr size_t kMaxListElements = 256;
inline constexpr size_t kMaxDeclsPerFile = 10000;

// Lexes and parses `file`. Always returns a module: declarations that parsed completely are kept
// (a sequence keeps the ops that parsed), so later stages can report further errors.
std::unique_ptr<Module> parse_module(FileId file, const SourceManager& sources,
                                     DiagnosticEngine& diags);

}  // namespace opfuse::dsl
