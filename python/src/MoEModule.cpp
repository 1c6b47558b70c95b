//===- MoEModule.cpp - moe_mlir._mlir: MLIR modules from Python -----------===//
//
// A small pybind11 module over the moe C API (libMoeMLIR-C): parse and print
// modules, run pass pipelines, compile to shared objects. MLIR diagnostics
// become the message of a moe_mlir.MLIRError.
//
//===----------------------------------------------------------------------===//

#include "moe-c/Compiler.h"
#include "moe-c/Dialects.h"
#include "moe-c/Models.h"
#include "moe-c/Parse.h"
#include "moe-c/Passes.h"

#include "mlir-c/Diagnostics.h"
#include "mlir-c/IR.h"

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

/// One MLIR context with every dialect moe programs use, collecting the
/// diagnostics of the call in progress.
struct Context {
  MlirContext ctx;
  std::vector<std::string> diagnostics;

  Context() {
    MlirDialectRegistry registry = mlirDialectRegistryCreate();
    moeRegisterAllDialects(registry);
    ctx = mlirContextCreateWithRegistry(registry, /*threadingEnabled=*/false);
    mlirDialectRegistryDestroy(registry);
    mlirContextAttachDiagnosticHandler(ctx, &Context::handle, this, nullptr);
    moeRegisterPasses();
  }
  ~Context() { mlirContextDestroy(ctx); }

  static MlirLogicalResult handle(MlirDiagnostic d, void *self) {
    std::string text;
    mlirDiagnosticPrint(
        d,
        [](MlirStringRef s, void *out) {
          static_cast<std::string *>(out)->append(s.data, s.length);
        },
        &text);
    auto severity = mlirDiagnosticGetSeverity(d);
    const char *kind = severity == MlirDiagnosticError     ? "error"
                       : severity == MlirDiagnosticWarning ? "warning"
                       : severity == MlirDiagnosticRemark  ? "remark"
                                                           : "note";
    std::string where;
    mlirLocationPrint(
        mlirDiagnosticGetLocation(d),
        [](MlirStringRef s, void *out) {
          static_cast<std::string *>(out)->append(s.data, s.length);
        },
        &where);
    static_cast<Context *>(self)->diagnostics.push_back(where + ": " + kind +
                                                        ": " + text);
    return mlirLogicalResultSuccess();
  }

  /// Raises MLIRError with the collected diagnostics.
  [[noreturn]] void raise(const std::string &what) {
    std::string message = what;
    for (auto &d : diagnostics)
      message += "\n" + d;
    diagnostics.clear();
    PyErr_SetString(
        py::module_::import("moe_mlir._errors").attr("MLIRError").ptr(),
        message.c_str());
    throw py::error_already_set();
  }
};

MlirStringRef ref(const std::string &s) {
  return mlirStringRefCreate(s.data(), s.size());
}

struct Module {
  std::shared_ptr<Context> context;
  MlirModule module;

  Module(std::shared_ptr<Context> c, MlirModule m) : context(c), module(m) {}
  Module(const Module &) = delete;
  ~Module() {
    if (!mlirModuleIsNull(module))
      mlirModuleDestroy(module);
  }

  static std::unique_ptr<Module> parse(const std::string &text) {
    auto context = std::make_shared<Context>();
    MlirModule m = moeModuleCreateParse(context->ctx, ref(text));
    if (mlirModuleIsNull(m))
      context->raise("cannot parse the module");
    auto module = std::make_unique<Module>(context, m);
    if (!mlirOperationVerify(mlirModuleGetOperation(m)))
      context->raise("the module does not verify");
    context->diagnostics.clear();
    return module;
  }

  static std::unique_ptr<Module> languageModel(const std::string &config,
                                               const std::string &source,
                                               int64_t batch, int64_t seq,
                                               bool documentMask,
                                               bool layerFunctions) {
    auto context = std::make_shared<Context>();
    MlirModule m = moeBuildLanguageModelWithOptions(
        context->ctx, ref(config), ref(source), batch, seq, documentMask,
        layerFunctions);
    if (mlirModuleIsNull(m))
      context->raise("cannot build the model of " + source);
    context->diagnostics.clear();
    return std::make_unique<Module>(context, m);
  }

  std::string str() const {
    std::string out;
    mlirOperationPrint(
        mlirModuleGetOperation(module),
        [](MlirStringRef s, void *o) {
          static_cast<std::string *>(o)->append(s.data, s.length);
        },
        &out);
    return out;
  }

  void run(const std::string &pipeline) {
    if (mlirLogicalResultIsFailure(moeRunPipeline(module, ref(pipeline))))
      context->raise("pass pipeline '" + pipeline + "' failed");
    context->diagnostics.clear();
  }

  void compile(const std::string &target, const std::string &output,
               const std::string &gpuOptions) {
    if (mlirLogicalResultIsFailure(moeCompileWithOptions(
            module, ref(target), ref(gpuOptions), ref(output))))
      context->raise("compiling for " + target + " failed");
    context->diagnostics.clear();
  }

  /// Remarks and warnings of the last successful call.
  std::vector<std::string> diagnostics() const { return context->diagnostics; }
};

} // namespace

PYBIND11_MODULE(_mlir, m) {
  m.doc() = "moe-mlir modules: parse, print, run pipelines, compile";
  py::class_<Module>(m, "Module")
      .def_static("parse", &Module::parse, py::arg("text"),
                  "Parses MLIR text (moe and upstream dialects); raises "
                  "MLIRError with the diagnostics if it is invalid.")
      .def_static("language_model", &Module::languageModel, py::arg("config"),
                  py::arg("source"), py::arg("batch"), py::arg("seq"),
                  py::arg("document_mask") = false,
                  py::arg("layer_functions") = false,
                  "The loss function of the MoE language model of a "
                  "config.json text (Qwen3-MoE family). document_mask: "
                  "@loss also takes each token's document (i32 [batch, "
                  "seq]) and attention stays within documents; "
                  "layer_functions: each kind of decoder layer is one "
                  "function called per layer")
      .def("run", &Module::run, py::arg("pipeline"),
           "Runs a textual pass pipeline, e.g. "
           "'builtin.module(moe-train-pipeline{ep-size=2})', in place.")
      .def("compile", &Module::compile, py::arg("target"), py::arg("output"),
           py::arg("gpu_options") = "",
           "Compiles to a shared object ('cpu' or a GPU chip such as "
           "'sm_90a'); the module is lowered in place. gpu_options: the GPU "
           "pipeline's options as moe-compile takes them, in its option "
           "syntax (e.g. 'pair-round-trips=always mx-activations=peak').")
      .def("__str__", &Module::str);
}
