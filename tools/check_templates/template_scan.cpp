// Clang 16 (libTooling) over generated translation units that include kernel templates, as
// CUDA device code: collects kernels and device functions and checks device bodies.
//
// Clang 16 knows CUDA up to 11.8; CUDA 13 headers parse through Clang's CUDA wrapper except for
// one header CUDA 13 removed (texture_fetch_functions.h), which an empty in-memory file stands in
// for (note "CUDA 13 under Clang 16" in cmake/template_checker.cmake).
#include "template_scan.h"

#include <clang/AST/ASTConsumer.h>
#include <clang/AST/ASTContext.h>
#include <clang/AST/ASTLambda.h>
#include <clang/AST/Attr.h>
#include <clang/AST/DeclTemplate.h>
#include <clang/AST/RecursiveASTVisitor.h>
#include <clang/Basic/SourceManager.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/FrontendAction.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Tooling/Tooling.h>
#include <fmt/format.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/VirtualFileSystem.h>
#include <llvm/Support/raw_ostream.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>

namespace opfuse::tools {
namespace {

namespace fs = std::filesystem;

constexpr const char* kShimDir = "/opfuse-check-templates/cuda-shim";
constexpr const char* kMainFileName = "opfuse_check_templates_main.cu";

// Callable on the device by CUDA's rules but not wanted in kernel templates: the device heap
// needs a host-sized limit and printf a host-read buffer; generated kernels do neither.
const std::set<std::string, std::less<>> kBannedDeviceCalls = {"malloc",  "free",   "calloc",
                                                               "realloc", "printf", "vprintf"};

std::string normalized(const fs::path& path) { return path.lexically_normal().generic_string(); }

// Where a declaration or expression is, in the templates directory or not.
class Locator {
 public:
  Locator(const clang::SourceManager& sources, std::string templates_dir)
      : sources_(sources), dir_(std::move(templates_dir)) {}

  // Path relative to the templates directory, or nullopt outside it (CUDA headers, the
  // generated main file).
  std::optional<std::string> header_of(clang::SourceLocation loc) const {
    const clang::SourceLocation file_loc = sources_.getExpansionLoc(loc);
    if (file_loc.isInvalid() || sources_.isWrittenInMainFile(file_loc)) return std::nullopt;
    const clang::OptionalFileEntryRef entry =
        sources_.getFileEntryRefForID(sources_.getFileID(file_loc));
    if (!entry) return std::nullopt;
    const fs::path relative = fs::path(normalized(entry->getName().str())).lexically_relative(dir_);
    if (relative.empty() || *relative.begin() == "..") return std::nullopt;
    return relative.generic_string();
  }

  Problem problem(clang::SourceLocation loc, std::string message, bool is_error = true) const {
    const clang::PresumedLoc presumed = sources_.getPresumedLoc(sources_.getExpansionLoc(loc));
    Problem p;
    if (presumed.isValid()) {
      p.file = presumed.getFilename();
      p.line = presumed.getLine();
      p.column = presumed.getColumn();
    }
    p.is_error = is_error;
    p.message = std::move(message);
    return p;
  }

  std::string position(clang::SourceLocation loc) const {
    const clang::PresumedLoc presumed = sources_.getPresumedLoc(sources_.getExpansionLoc(loc));
    if (presumed.isInvalid()) return "?";
    return fmt::format("{}:{}", fs::path(presumed.getFilename()).filename().string(),
                       presumed.getLine());
  }

 private:
  const clang::SourceManager& sources_;
  fs::path dir_;
};

bool is_double(clang::QualType type) {
  if (type.isNull() || type->isDependentType()) return false;
  const clang::QualType canonical = type.getCanonicalType();
  return canonical->isSpecificBuiltinType(clang::BuiltinType::Double) ||
         canonical->isSpecificBuiltinType(clang::BuiltinType::LongDouble);
}

bool is_device_side(const clang::FunctionDecl& f) {
  return f.hasAttr<clang::CUDADeviceAttr>() || f.hasAttr<clang::CUDAGlobalAttr>();
}

// A constexpr function written without __device__: Clang adds the attribute implicitly
// (-fcuda-host-device-constexpr), nvcc does not. Lambdas and compiler-declared members take
// their side from where they are used in both compilers.
bool is_implicitly_device_constexpr(const clang::FunctionDecl& f) {
  const auto* device = f.getAttr<clang::CUDADeviceAttr>();
  return f.isConstexpr() && device != nullptr && device->isImplicit() && !f.isImplicit() &&
         !clang::isLambdaCallOperator(&f);
}

// The declaration a function was instantiated from, so a call site reads the same in every
// instantiation and is reported once.
const clang::FunctionDecl& pattern_of(const clang::FunctionDecl& f) {
  const clang::FunctionDecl* pattern = f.getTemplateInstantiationPattern();
  return pattern != nullptr ? *pattern : f;
}

// Check 2 and 3 over one device function's body.
class DeviceBodyChecker : public clang::RecursiveASTVisitor<DeviceBodyChecker> {
 public:
  DeviceBodyChecker(const Locator& locator, std::string caller, std::set<Problem>& problems)
      : locator_(locator), caller_(std::move(caller)), problems_(problems) {}

  bool VisitCallExpr(clang::CallExpr* call) {
    if (const clang::FunctionDecl* callee = call->getDirectCallee()) {
      check_callee(*callee, call->getBeginLoc());
    }
    if (is_double(call->getType())) {
      report(call->getBeginLoc(), "returns double", /*is_error=*/false, /*fp64=*/true);
    }
    return true;
  }

  bool VisitCXXConstructExpr(clang::CXXConstructExpr* construct) {
    const clang::CXXConstructorDecl* constructor = construct->getConstructor();
    if (constructor != nullptr && !constructor->isTrivial()) {
      check_callee(*constructor, construct->getBeginLoc());
    }
    return true;
  }

  bool VisitCXXNewExpr(clang::CXXNewExpr* expr) {
    if (expr->getNumPlacementArgs() == 0) {
      report(expr->getBeginLoc(),
             "allocates with new: no device heap allocation in kernel templates");
    }
    return true;
  }

  bool VisitBinaryOperator(clang::BinaryOperator* op) {
    if (!op->isMultiplicativeOp() && !op->isAdditiveOp() && !op->isComparisonOp() &&
        !op->isCompoundAssignmentOp()) {
      return true;
    }
    clang::QualType computation = op->getLHS()->getType();
    if (const auto* compound = llvm::dyn_cast<clang::CompoundAssignOperator>(op)) {
      computation = compound->getComputationLHSType();
    }
    if (is_double(computation) || is_double(op->getRHS()->getType())) {
      report(op->getOperatorLoc(),
             fmt::format("computes '{}' in double precision", op->getOpcodeStr().str()),
             /*is_error=*/false, /*fp64=*/true);
    }
    return true;
  }

 private:
  void check_callee(const clang::FunctionDecl& callee, clang::SourceLocation where) {
    const std::string name = callee.getQualifiedNameAsString();
    if (callee.isInStdNamespace()) {
      report(where, fmt::format("calls '{}': NVRTC has no host standard library", name));
    } else if (callee.getDeclContext()->getRedeclContext()->isTranslationUnit() &&
               kBannedDeviceCalls.contains(name)) {
      report(where, fmt::format("calls '{}': kernel templates neither allocate on the device "
                                "heap nor print",
                                name));
    } else if (callee.getBuiltinID() != 0) {
      return;
    } else if (!is_device_side(callee)) {
      report(where, fmt::format("calls host-only function '{}' (declared without __device__ at {})",
                                name, locator_.position(callee.getLocation())));
    } else if (is_implicitly_device_constexpr(callee)) {
      report(where, fmt::format("calls constexpr function '{}' that has no __device__ (declared at "
                                "{}): Clang makes it __host__ __device__, nvcc without "
                                "--expt-relaxed-constexpr does not",
                                name, locator_.position(callee.getLocation())));
    }
  }

  void report(clang::SourceLocation where, const std::string& what, bool is_error = true,
              bool fp64 = false) {
    Problem p =
        locator_.problem(where, fmt::format("device function '{}' {}", caller_, what), is_error);
    p.double_precision = fp64;
    problems_.insert(std::move(p));
  }

  const Locator& locator_;
  std::string caller_;
  std::set<Problem>& problems_;
};

FoundParam describe_template_param(const clang::NamedDecl& decl, const clang::ASTContext& context,
                                   const clang::SourceManager& sources) {
  FoundParam param;
  param.name = decl.getNameAsString();
  const clang::PresumedLoc where =
      sources.getPresumedLoc(sources.getExpansionLoc(decl.getLocation()));
  if (where.isValid()) {
    param.line = where.getLine();
    param.column = where.getColumn();
  }
  const clang::PrintingPolicy& policy = context.getPrintingPolicy();
  if (const auto* type_param = llvm::dyn_cast<clang::TemplateTypeParmDecl>(&decl)) {
    param.shape = ParamShape::Type;
    param.spelled = "typename";
    param.is_pack = type_param->isParameterPack();
    if (type_param->hasDefaultArgument()) {
      param.default_value = type_param->getDefaultArgument().getAsString(policy);
    }
  } else if (const auto* value_param = llvm::dyn_cast<clang::NonTypeTemplateParmDecl>(&decl)) {
    const clang::QualType type = value_param->getType().getCanonicalType();
    const bool is_bool = type->isSpecificBuiltinType(clang::BuiltinType::Bool);
    param.shape = is_bool                                                ? ParamShape::Bool
                  : type->isSpecificBuiltinType(clang::BuiltinType::Int) ? ParamShape::Int
                                                                         : ParamShape::Other;
    param.spelled = value_param->getType().getAsString(policy);
    param.is_pack = value_param->isParameterPack();
    if (value_param->hasDefaultArgument()) {
      const clang::Expr* value = value_param->getDefaultArgument();
      clang::Expr::EvalResult result;
      if (!value->isValueDependent() && value->EvaluateAsInt(result, context)) {
        const llvm::APSInt& number = result.Val.getInt();
        param.default_value =
            is_bool ? (number.getBoolValue() ? "true" : "false") : llvm::toString(number, 10);
      } else {
        param.default_value = "(not a constant)";
      }
    }
  } else {
    param.spelled = "template template parameter";
  }
  return param;
}

FoundFunctionParam describe_function_param(const clang::ParmVarDecl& parm,
                                           const clang::ASTContext& context) {
  FoundFunctionParam found;
  const clang::QualType type = parm.getType();
  found.type = type.getAsString(context.getPrintingPolicy());
  found.by_value = !type->isReferenceType() && !type->isPointerType();
  const clang::Type* named = type.getNonReferenceType().getTypePtr();
  if (const auto* elaborated = llvm::dyn_cast<clang::ElaboratedType>(named)) {
    named = elaborated->getNamedType().getTypePtr();
  }
  if (const auto* specialization = llvm::dyn_cast<clang::TemplateSpecializationType>(named)) {
    if (const clang::TemplateDecl* decl = specialization->getTemplateName().getAsTemplateDecl()) {
      found.record = decl->getQualifiedNameAsString();
    }
    for (const clang::TemplateArgument& arg : specialization->template_arguments()) {
      std::string spelled;
      llvm::raw_string_ostream out(spelled);
      arg.print(context.getPrintingPolicy(), out, /*IncludeType=*/false);
      found.record_args.push_back(out.str());
    }
  } else if (const auto* record = named->getAs<clang::RecordType>()) {
    found.record = record->getDecl()->getQualifiedNameAsString();
  }
  return found;
}

// Collects kernels, device functions and opfuse records of one translation unit and runs the
// body checks on every device function defined in templates/ (instantiations included).
class TemplateVisitor : public clang::RecursiveASTVisitor<TemplateVisitor> {
 public:
  TemplateVisitor(const clang::ASTContext& context, const Locator& locator, Findings& findings)
      : context_(context), locator_(locator), findings_(findings) {}

  bool shouldVisitTemplateInstantiations() const { return true; }

  bool VisitCXXRecordDecl(clang::CXXRecordDecl* record) {
    if (record->isThisDeclarationADefinition() && locator_.header_of(record->getLocation())) {
      findings_.records.insert(record->getQualifiedNameAsString());
    }
    return true;
  }

  bool VisitFunctionDecl(clang::FunctionDecl* function) {
    if (!function->doesThisDeclarationHaveABody() || !is_device_side(*function)) return true;
    const std::optional<std::string> header = locator_.header_of(function->getLocation());
    if (!header) return true;
    const clang::FunctionDecl& pattern = pattern_of(*function);
    const Problem where = locator_.problem(pattern.getLocation(), "");
    findings_.device_functions.insert(fmt::format(
        "{}:{}:{} {}", where.file, where.line, where.column, pattern.getQualifiedNameAsString()));
    if (function->hasAttr<clang::CUDAGlobalAttr>() &&
        (function->getTemplatedKind() == clang::FunctionDecl::TK_NonTemplate ||
         function->getTemplatedKind() == clang::FunctionDecl::TK_FunctionTemplate)) {
      record_kernel(*function, *header, where);
    }
    if (function->getBody() != nullptr) {
      DeviceBodyChecker checker(locator_, pattern.getQualifiedNameAsString(), findings_.problems);
      checker.TraverseStmt(function->getBody());
    }
    return true;
  }

 private:
  void record_kernel(const clang::FunctionDecl& function, const std::string& header,
                     const Problem& where) {
    FoundKernel kernel;
    kernel.qualified_name = function.getQualifiedNameAsString();
    kernel.header = header;
    kernel.file = where.file;
    kernel.line = where.line;
    kernel.column = where.column;
    if (const clang::FunctionTemplateDecl* described = function.getDescribedFunctionTemplate()) {
      kernel.is_template = true;
      for (const clang::NamedDecl* param : *described->getTemplateParameters()) {
        kernel.params.push_back(
            describe_template_param(*param, context_, context_.getSourceManager()));
      }
    }
    for (const clang::ParmVarDecl* parm : function.parameters()) {
      kernel.function_params.push_back(describe_function_param(*parm, context_));
    }
    findings_.kernels.emplace(std::tuple(kernel.qualified_name, kernel.file, kernel.line),
                              std::move(kernel));
  }

  const clang::ASTContext& context_;
  const Locator& locator_;
  Findings& findings_;
};

class TemplateConsumer : public clang::ASTConsumer {
 public:
  TemplateConsumer(std::string templates_dir, Findings& findings)
      : dir_(std::move(templates_dir)), findings_(findings) {}

  void HandleTranslationUnit(clang::ASTContext& context) override {
    const Locator locator(context.getSourceManager(), dir_);
    TemplateVisitor(context, locator, findings_).TraverseDecl(context.getTranslationUnitDecl());
  }

 private:
  std::string dir_;
  Findings& findings_;
};

class TemplateAction : public clang::ASTFrontendAction {
 public:
  TemplateAction(std::string templates_dir, Findings& findings)
      : dir_(std::move(templates_dir)), findings_(findings) {}

  std::unique_ptr<clang::ASTConsumer> CreateASTConsumer(clang::CompilerInstance& /*compiler*/,
                                                        llvm::StringRef /*file*/) override {
    return std::make_unique<TemplateConsumer>(dir_, findings_);
  }

 private:
  std::string dir_;
  Findings& findings_;
};

struct ParseResult {
  Findings findings;
  std::string clang_output;  // Clang's own diagnostics, as Clang prints them
  double seconds = 0;
};

// Parses `code` as CUDA device code, as if it were a file of the templates directory (a virtual
// one: nothing is written there).
ParseResult parse(const ScanOptions& options, const std::string& code) {
  const auto start = std::chrono::steady_clock::now();
  ParseResult result;
  llvm::IntrusiveRefCntPtr<llvm::vfs::OverlayFileSystem> overlay(
      new llvm::vfs::OverlayFileSystem(llvm::vfs::getRealFileSystem()));
  llvm::IntrusiveRefCntPtr<llvm::vfs::InMemoryFileSystem> memory(new llvm::vfs::InMemoryFileSystem);
  overlay->pushOverlay(memory);
  const std::string main_file = normalized(fs::path(options.templates_dir) / kMainFileName);
  memory->addFile(main_file, 0, llvm::MemoryBuffer::getMemBufferCopy(code, main_file));
  // CUDA 13 removed this header; Clang 16's CUDA wrapper still includes it. -idirafter: a
  // toolkit that has it wins.
  memory->addFile(std::string(kShimDir) + "/texture_fetch_functions.h", 0,
                  llvm::MemoryBuffer::getMemBuffer(""));
  llvm::IntrusiveRefCntPtr<clang::FileManager> files(
      new clang::FileManager(clang::FileSystemOptions(), overlay));

  std::vector<std::string> command = {"clang",
                                      "-x",
                                      "cuda",
                                      "--cuda-device-only",
                                      "--cuda-gpu-arch=" + options.arch,
                                      "-nocudalib",
                                      "--cuda-path=" + options.cuda_path,
                                      "-resource-dir=" + options.resource_dir,
                                      "-std=c++17",
                                      "-Wno-unknown-cuda-version",
                                      "-idirafter",
                                      kShimDir,
                                      "-fsyntax-only",
                                      main_file};
  llvm::IntrusiveRefCntPtr<clang::DiagnosticOptions> diagnostic_options(
      new clang::DiagnosticOptions);
  llvm::raw_string_ostream clang_output(result.clang_output);
  clang::TextDiagnosticPrinter printer(clang_output, diagnostic_options.get());
  clang::tooling::ToolInvocation invocation(
      command, std::make_unique<TemplateAction>(options.templates_dir, result.findings),
      files.get());
  invocation.setDiagnosticConsumer(&printer);
  if (!invocation.run() && printer.getNumErrors() == 0) {
    result.findings.problems.insert({"", 0, 0, true, "Clang could not run on " + main_file});
  }
  clang_output.flush();
  result.findings.clang_errors += printer.getNumErrors();
  result.findings.clang_warnings += printer.getNumWarnings();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void merge(Findings& into, Findings&& from) {
  into.kernels.merge(from.kernels);
  into.device_functions.merge(from.device_functions);
  into.records.merge(from.records);
  into.problems.merge(from.problems);
  into.clang_errors += from.clang_errors;
  into.clang_warnings += from.clang_warnings;
}

}  // namespace

void scan_templates(const ScanOptions& options, const std::vector<ScanUnit>& units,
                    Findings& findings) {
  std::vector<ParseResult> results(units.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < units.size(); i = next++) {
      results[i] = parse(options, units[i].code);
    }
  };
  std::vector<std::thread> threads;
  const size_t thread_count =
      std::clamp<size_t>(options.jobs, 1, std::max<size_t>(units.size(), 1));
  for (size_t t = 1; t < thread_count; ++t) threads.emplace_back(work);
  work();
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < units.size(); ++i) {
    std::fputs(results[i].clang_output.c_str(), stderr);
    if (options.verbose) {
      std::fprintf(stderr, "check_templates: parsed %s in %.2f s\n", units[i].label.c_str(),
                   results[i].seconds);
    }
    merge(findings, std::move(results[i].findings));
  }
}

}  // namespace opfuse::tools
