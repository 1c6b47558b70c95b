//===- Compiler.cpp - moe programs to shared objects ----------------------===//

#include "moe/Compiler/Compiler.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Pipelines/Pipelines.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FileUtilities.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Host.h"

using namespace mlir;

namespace {
/// One manifest line for a type: `<dtype> <rank> <dims...>` (-1 = dynamic).
static std::string describe(Type type) {
  std::string s;
  llvm::raw_string_ostream os(s);
  auto shaped = dyn_cast<ShapedType>(type);
  if (!shaped) {
    type.print(os);
    os << " 0";
    return s;
  }
  shaped.getElementType().print(os);
  os << " " << shaped.getRank();
  for (int64_t d : shaped.getShape())
    os << " " << (ShapedType::isDynamic(d) ? -1 : d);
  return s;
}

/// Which dynamic argument dimensions of each public function must agree:
/// the program indexes them with one loop, or builds one tensor from both.
/// Found on a copy lowered to linalg (every moe op becomes structured ops
/// with indexing maps) by joining, per op, the dimensions it requires equal:
/// a structured op's operand dimensions read by one loop, a destination's
/// result and init, the operands and results of same-shape ops, a
/// tensor.empty sized by tensor.dim, a tensor.cast's two sides. Static
/// sizes join too, so a dynamic dimension tied to a static one is fixed.
/// Returns, per function, `sizes` manifest lines; nothing when no public
/// function takes a dynamic dimension (the usual case: no copy is made).
static llvm::StringMap<SmallVector<std::string>>
sizeConstraints(ModuleOp module) {
  llvm::StringMap<SmallVector<std::string>> lines;
  bool dynamic = llvm::any_of(module.getOps<func::FuncOp>(), [](auto f) {
    return !f.isExternal() && !f.isPrivate() &&
           llvm::any_of(f.getArgumentTypes(), [](Type t) {
             auto r = dyn_cast<RankedTensorType>(t);
             return r && !r.hasStaticShape();
           });
  });
  if (!dynamic)
    return lines;
  OwningOpRef<ModuleOp> copy = cast<ModuleOp>(module->clone());
  {
    PassManager pm(module.getContext());
    pm.addPass(moe::createConvertMoEToLinalg());
    pm.addPass(createCanonicalizerPass());
    // (A failure shows again, with its diagnostics, in the real lowering.)
    ScopedDiagnosticHandler quiet(module.getContext(),
                                  [](Diagnostic &) { return success(); });
    if (failed(pm.run(*copy)))
      return lines;
  }
  for (auto func : copy->getOps<func::FuncOp>()) {
    if (func.isExternal() || func.isPrivate())
      continue;
    // Union-find over (value, dimension), loops ((op, -1 - loop)) and
    // static sizes ((null, size)).
    using Key = std::pair<const void *, int64_t>;
    llvm::DenseMap<Key, unsigned> ids;
    SmallVector<unsigned> parent;
    auto id = [&](Key k) {
      auto [it, inserted] = ids.try_emplace(k, parent.size());
      if (inserted)
        parent.push_back(parent.size());
      return it->second;
    };
    auto find = [&](unsigned x) {
      while (parent[x] != x)
        x = parent[x] = parent[parent[x]];
      return x;
    };
    auto join = [&](Key a, Key b) { parent[find(id(a))] = find(id(b)); };
    auto dimKey = [](Value v, int64_t d) -> Key {
      auto t = cast<ShapedType>(v.getType());
      if (!t.isDynamicDim(d))
        return {nullptr, t.getDimSize(d)};
      return {v.getAsOpaquePointer(), d};
    };
    auto ranked = [](Value v) {
      auto t = dyn_cast<RankedTensorType>(v.getType());
      return t ? t.getRank() : int64_t(-1);
    };
    auto joinAll = [&](ValueRange a, ValueRange b) {
      for (Value x : a)
        for (Value y : b)
          if (ranked(x) >= 0 && ranked(x) == ranked(y))
            for (int64_t d = 0; d < ranked(x); ++d)
              join(dimKey(x, d), dimKey(y, d));
    };
    func.walk([&](Operation *op) {
      if (auto linalgOp = dyn_cast<linalg::LinalgOp>(op)) {
        for (OpOperand &o : op->getOpOperands()) {
          if (ranked(o.get()) < 0)
            continue;
          AffineMap map = linalgOp.getMatchingIndexingMap(&o);
          for (auto [d, e] : llvm::enumerate(map.getResults()))
            if (auto loop = dyn_cast<AffineDimExpr>(e))
              join(dimKey(o.get(), d), {op, -1 - int64_t(loop.getPosition())});
        }
      }
      if (auto dps = dyn_cast<DestinationStyleOpInterface>(op))
        for (OpResult r : op->getResults())
          if (ranked(r) >= 0)
            joinAll(r, dps.getTiedOpOperand(r)->get());
      if (op->hasTrait<OpTrait::SameOperandsAndResultShape>() ||
          op->hasTrait<OpTrait::SameOperandsAndResultType>() ||
          isa<tensor::CastOp>(op)) {
        SmallVector<Value> all(op->getOperands());
        all.append(op->getResults().begin(), op->getResults().end());
        joinAll(all, all);
      }
      if (auto empty = dyn_cast<tensor::EmptyOp>(op))
        for (int64_t d = 0; d < empty.getType().getRank(); ++d)
          if (empty.getType().isDynamicDim(d))
            if (auto dim =
                    empty.getDynamicSize(d).getDefiningOp<tensor::DimOp>())
              if (std::optional<int64_t> c = dim.getConstantIndex())
                if (ranked(dim.getSource()) > *c)
                  join(dimKey(empty, d), dimKey(dim.getSource(), *c));
    });
    // The arguments' dynamic dimensions by class, with the class's static
    // size when it has one.
    llvm::MapVector<unsigned, SmallVector<std::string>> members;
    llvm::DenseMap<unsigned, int64_t> fixed;
    for (auto [k, i] : ids)
      if (!k.first)
        fixed.try_emplace(find(i), k.second);
    for (BlockArgument arg : func.getArguments())
      for (int64_t d = 0; d < ranked(arg); ++d)
        if (cast<ShapedType>(arg.getType()).isDynamicDim(d))
          members[find(id(dimKey(arg, d)))].push_back(
              (Twine(arg.getArgNumber()) + ":" + Twine(d)).str());
    for (auto &[root, dims] : members) {
      auto size = fixed.find(root);
      if (dims.size() < 2 && size == fixed.end())
        continue;
      std::string line = "sizes " + llvm::join(dims, " ");
      if (size != fixed.end())
        line += " = " + std::to_string(size->second);
      lines[func.getSymName()].push_back(line);
    }
  }
  return lines;
}

/// The public functions' signatures, one item per line:
///   function <name>
///   arg <dtype> <rank> <dims...> [range <lo> <hi>] [shard <experts> <local>]
///       [param <name> init <normal|ones> [hf_transposed]] [input <role>]
///       [state <exp_avg|exp_avg_sq> <arg>] [updated]
///   result <dtype> <rank> <dims...> [gradient_of <arg>] [output <name>]
///   sizes <arg>:<dim> <arg>:<dim>... [= <size>] (dynamic argument
///   dimensions that must be one size; when fixed, that size)
/// An `updated` argument is written in place by the function (a result
/// with moe.updates, which is not a result of the compiled function).
///   meta <key> <value> (the string entries of moe.meta)
///   tolerance <atol> <rtol> [<norm>] (moe.test_tolerance = [atol, rtol(,
///   norm)])
static std::string manifest(ModuleOp module, StringRef targetName) {
  std::string s;
  llvm::raw_string_ostream os(s);
  llvm::StringMap<SmallVector<std::string>> sizes = sizeConstraints(module);
  os << "target " << targetName << "\n";
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func.isExternal() || func.isPrivate())
      continue;
    os << "function " << func.getSymName() << "\n";
    for (auto [i, t] : llvm::enumerate(func.getArgumentTypes())) {
      os << "arg " << describe(t);
      if (auto range = func.getArgAttrOfType<ArrayAttr>(i, "moe.test_range"))
        if (range.size() == 2 && isa<IntegerAttr>(range[0]) &&
            isa<IntegerAttr>(range[1]))
          os << " range " << cast<IntegerAttr>(range[0]).getInt() << " "
             << cast<IntegerAttr>(range[1]).getInt();
      // This rank's slice of stacked expert weights (-moe-expert-parallel).
      if (auto shard =
              func.getArgAttrOfType<DictionaryAttr>(i, "moe.expert_shard"))
        if (auto e = shard.getAs<IntegerAttr>("experts"))
          if (auto l = shard.getAs<IntegerAttr>("local_experts"))
            os << " shard " << e.getInt() << " " << l.getInt();
      // Model parameters and data inputs (moe-model graphs).
      if (auto name = func.getArgAttrOfType<StringAttr>(i, "moe.param")) {
        os << " param " << name.getValue();
        if (auto init = func.getArgAttrOfType<StringAttr>(i, "moe.init"))
          os << " init " << init.getValue();
        if (func.getArgAttr(i, "moe.hf_transposed"))
          os << " hf_transposed";
      }
      if (auto role = func.getArgAttrOfType<StringAttr>(i, "moe.input"))
        os << " input " << role.getValue();
      // Optimizer state (-moe-adamw) and arguments updated in place.
      if (auto state = func.getArgAttrOfType<StringAttr>(i, "moe.state"))
        if (auto of = func.getArgAttrOfType<IntegerAttr>(i, "moe.state_of"))
          os << " state " << state.getValue() << " " << of.getInt();
      if (llvm::any_of(llvm::seq(func.getNumResults()), [&](unsigned r) {
            auto u = func.getResultAttrOfType<IntegerAttr>(r, "moe.updates");
            return u && u.getInt() == int64_t(i);
          }))
        os << " updated";
      os << "\n";
    }
    for (auto [i, t] : llvm::enumerate(func.getResultTypes())) {
      if (func.getResultAttr(i, "moe.updates"))
        continue;
      os << "result " << describe(t);
      if (auto of = func.getResultAttrOfType<IntegerAttr>(i, "moe.gradient_of"))
        os << " gradient_of " << of.getInt();
      if (auto name = func.getResultAttrOfType<StringAttr>(i, "moe.output"))
        os << " output " << name.getValue();
      os << "\n";
    }
    for (const std::string &line : sizes.lookup(func.getSymName()))
      os << line << "\n";
    if (auto meta = func->getAttrOfType<DictionaryAttr>("moe.meta"))
      for (NamedAttribute a : meta)
        if (auto v = dyn_cast<StringAttr>(a.getValue()))
          if (!v.getValue().contains('\n'))
            os << "meta " << a.getName().getValue() << " " << v.getValue()
               << "\n";
    if (auto tol = func->getAttrOfType<ArrayAttr>("moe.test_tolerance"))
      if ((tol.size() == 2 || tol.size() == 3) &&
          llvm::all_of(tol, [](Attribute a) { return isa<FloatAttr>(a); })) {
        os << "tolerance";
        for (Attribute a : tol)
          os << " " << cast<FloatAttr>(a).getValueAsDouble();
        os << "\n";
      }
  }
  return s;
}

/// For every `_mlir_ciface_<name>(ptr...)`, adds `_mlir_packed_<name>(ptr
/// args)` calling it with the pointers stored in `args[0..n)` (results
/// buffer first when the function has results): a caller in C can then pass
/// any number of arguments.
static void addPackedEntryPoints(llvm::Module &m) {
  llvm::LLVMContext &ctx = m.getContext();
  auto *ptr = llvm::PointerType::getUnqual(ctx);
  SmallVector<llvm::Function *> entries;
  for (llvm::Function &f : m)
    if (!f.isDeclaration() && f.getName().starts_with("_mlir_ciface_"))
      entries.push_back(&f);
  for (llvm::Function *f : entries) {
    auto *type = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {ptr},
                                         /*isVarArg=*/false);
    std::string name =
        ("_mlir_packed_" + f->getName().drop_front(strlen("_mlir_ciface_")))
            .str();
    auto *packed = llvm::Function::Create(
        type, llvm::GlobalValue::ExternalLinkage, name, m);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", packed));
    SmallVector<llvm::Value *> args;
    for (auto [i, param] : llvm::enumerate(f->args())) {
      llvm::Value *slot = b.CreateConstGEP1_64(ptr, packed->getArg(0), i);
      llvm::Value *v = b.CreateLoad(ptr, slot);
      args.push_back(
          param.getType() == ptr ? v : b.CreateBitCast(v, param.getType()));
    }
    b.CreateCall(f, args);
    b.CreateRetVoid();
  }
}

/// Rejects MX values at the boundary: artifacts take plain tensors.
static LogicalResult checkSignatures(ModuleOp module) {
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func.isExternal() || func.isPrivate())
      continue;
    for (Type t : llvm::concat<const Type>(func.getArgumentTypes(),
                                           func.getResultTypes()))
      if (!isa<RankedTensorType, IntegerType, FloatType, IndexType>(t))
        return func.emitError("public function @")
               << func.getSymName() << " takes or returns " << t
               << "; artifacts exchange ranked tensors and scalars "
                  "(moe.mx_unpack an MX value to return its data and scales)";
  }
  return success();
}

static std::optional<std::string> findProgram(StringRef name) {
  if (auto path = llvm::sys::findProgramByName(name))
    return *path;
  return std::nullopt;
}

} // namespace

void mlir::moe::registerCompilerDialects(DialectRegistry &registry) {
  registerAllDialects(registry);
  registerAllExtensions(registry);
  registerAllToLLVMIRTranslations(registry);
  registry.insert<moe::MoEDialect>();
}

LogicalResult mlir::moe::compileToSharedObject(ModuleOp moduleOp,
                                               StringRef output,
                                               const CompileOptions &opts,
                                               llvm::raw_ostream &log) {
  MLIRContext &context = *moduleOp.getContext();
  auto fail = [&](const Twine &message) {
    return emitError(moduleOp.getLoc(), "moe-compile: ") << message;
  };
  const std::string &target = opts.target;
  bool gpu = target != "cpu";
  std::optional<GPUChip> chip;
  if (gpu && !(chip = symbolizeGPUChip(target)))
    return fail("unknown target '" + target + "': use cpu or a GPU chip (" +
                gpuChipNames() + ")");
  std::string format = opts.kernelFormat;
  if (format != "auto" && !symbolizeKernelFormat(format))
    return fail("unknown kernel format '" + format +
                "': use auto, isa, bin or fatbin");
  if (!opts.emitPTX.empty() || opts.verifyPTX)
    format = "isa";
  else if (format == "auto")
    format = findProgram("ptxas") ? "fatbin" : "isa";
  // The GPU pipeline's options, checked before anything is changed.
  auto gpuOptions = std::make_unique<moe::GPUPipelineOptions>();
  if (gpu) {
    for (StringRef word : llvm::split(StringRef(opts.gpuOptions), ' '))
      if (word.starts_with("chip=") || word.starts_with("format="))
        return fail("GPU option '" + word +
                    "': the chip and format come from the target and the "
                    "kernel format");
    std::string parseErrors;
    LogicalResult parsed = failure();
    {
      // The option parser's own words go into the diagnostic.
      llvm::raw_string_ostream errs(parseErrors);
      parsed = gpuOptions->parseFromString(opts.gpuOptions, errs);
    }
    if (failed(parsed)) {
      StringRef why = StringRef(parseErrors).trim();
      // A bad value of a known option is reported by the option parser
      // itself (on stderr); name where the good ones are listed.
      return fail("bad GPU options '" + opts.gpuOptions + "': " +
                  (why.empty() ? StringRef("an unknown value (moe-compile "
                                           "--help lists the values)")
                               : why));
    }
    gpuOptions->chip = *chip;
    gpuOptions->format = *symbolizeKernelFormat(format);
    if (opts.bufferReport)
      gpuOptions->bufferReport = true;
  } else if (!opts.gpuOptions.empty()) {
    return fail("GPU options ('" + opts.gpuOptions + "') given for target cpu");
  }
  if (failed(checkSignatures(moduleOp)))
    return failure();
  std::string error;
  ModuleOp module = moduleOp;
  std::string outputFile = output.str();
  std::string manifestText = manifest(module, target);

  // C entry points for every public function; the test annotations are in
  // the manifest now.
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func.isExternal() || func.isPrivate())
      continue;
    func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                  UnitAttr::get(&context));
    func->removeAttr("moe.test_tolerance");
    for (unsigned i = 0; i < func.getNumArguments(); ++i) {
      func.removeArgAttr(i, "moe.test_range");
      func.removeArgAttr(i, "moe.expert_shard");
    }
    for (unsigned i = 0; i < func.getNumResults(); ++i)
      func.removeResultAttr(i, StringAttr::get(&context, "moe.gradient_of"));
  }

  PassManager pm(&context);
  if (gpu) {
    moe::buildGPUPipeline(pm, *gpuOptions);
  } else {
    moe::buildCPUPipeline(pm, opts.bufferReport);
  }
  if (opts.configurePassManager && failed(opts.configurePassManager(pm)))
    return fail("bad pass manager options");
  if (failed(pm.run(module)))
    return fail("lowering failed");

  // The kernels' PTX, one module per gpu.binary (isa format).
  SmallVector<std::pair<std::string, std::string>> ptxModules;
  module.walk([&](gpu::BinaryOp binary) {
    for (Attribute object : binary.getObjects())
      if (auto o = dyn_cast<gpu::ObjectAttr>(object))
        ptxModules.push_back(
            {binary.getSymName().str(), o.getObject().getValue().str()});
  });
  if (!opts.emitPTX.empty()) {
    auto out = openOutputFile(opts.emitPTX, &error);
    if (!out)
      return fail(error);
    for (auto &[name, ptx] : ptxModules)
      out->os() << "// ---- kernel module " << name << "\n" << ptx << "\n";
    out->keep();
  }
  if (opts.verifyPTX) {
    auto ptxas = findProgram("ptxas");
    if (!ptxas)
      return fail("verifying PTX needs ptxas on PATH (from the CUDA toolkit)");
    for (auto &[name, ptx] : ptxModules) {
      llvm::SmallString<128> path;
      int ptxFd;
      if (auto ec = llvm::sys::fs::createTemporaryFile("moe-kernel", "ptx",
                                                       ptxFd, path))
        return fail("cannot create a temporary file: " + ec.message());
      llvm::FileRemover removePtx(path);
      {
        llvm::raw_fd_ostream os(ptxFd, /*shouldClose=*/true);
        os << ptx;
      }
      // ptxas' own output (its diagnostics) goes to a file read back below.
      llvm::SmallString<128> notesPath;
      if (auto ec = llvm::sys::fs::createTemporaryFile("moe-kernel", "txt",
                                                       notesPath))
        return fail("cannot create a temporary file: " + ec.message());
      llvm::FileRemover removeNotes(notesPath);
      std::string arch = "-arch=" + target;
      llvm::SmallVector<llvm::StringRef> args = {*ptxas, arch, "-o",
                                                 "/dev/null", path.str()};
      std::optional<llvm::StringRef> redirects[] = {
          std::nullopt, notesPath.str(), notesPath.str()};
      std::string message;
      int rc = llvm::sys::ExecuteAndWait(*ptxas, args, std::nullopt, redirects,
                                         0, 0, &message);
      auto notes = llvm::MemoryBuffer::getFile(notesPath);
      llvm::StringRef text = notes ? (*notes)->getBuffer() : "";
      if (rc != 0)
        return fail("ptxas rejected kernel module " + name +
                    (message.empty() ? "" : ": " + message) +
                    (text.empty() ? "" : "\n" + text.rtrim().str()));
      // What ptxas accepts but reports as slow (setmaxnreg ignored, wgmma
      // serialized, ...) is worth a line each: the kernel runs, slower.
      llvm::SmallVector<llvm::StringRef> lines;
      text.split(lines, '\n', -1, false);
      for (llvm::StringRef line : lines)
        if (line.contains("Performance Loss") || line.contains("warning"))
          log << "ptxas, kernel module " << name << ": "
              << (line.contains(" : ") ? line.split(" : ").second : line).trim()
              << "\n";
    }
    log << "ptxas accepted " << ptxModules.size() << " kernel modules for "
        << target << "\n";
  }

  // Our argument and result attributes (moe.*) went into the manifest; the
  // LLVM IR translation does not know them.
  module.walk([](FunctionOpInterface f) {
    auto strip = [](ArrayRef<NamedAttribute> attrs) {
      return llvm::to_vector(
          llvm::make_filter_range(attrs, [](NamedAttribute a) {
            return !a.getName().getValue().starts_with("moe.");
          }));
    };
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      f.setArgAttrs(i, strip(f.getArgAttrs(i)));
    for (unsigned i = 0; i < f.getNumResults(); ++i)
      f.setResultAttrs(i, strip(f.getResultAttrs(i)));
  });

  // LLVM IR, with the manifest as an exported constant.
  llvm::LLVMContext llvmContext;
  auto llvmModule = translateModuleToLLVMIR(module, llvmContext, "moe");
  if (!llvmModule)
    return fail("translation to LLVM IR failed");
  {
    auto *init = llvm::ConstantDataArray::getString(llvmContext, manifestText);
    new llvm::GlobalVariable(*llvmModule, init->getType(), /*isConstant=*/true,
                             llvm::GlobalValue::ExternalLinkage, init,
                             "moe_manifest");
  }

  addPackedEntryPoints(*llvmModule);

  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  std::string triple = llvm::sys::getDefaultTargetTriple();
  llvm::Triple hostTriple(triple);
  const llvm::Target *llvmTarget =
      llvm::TargetRegistry::lookupTarget(hostTriple, error);
  if (!llvmTarget)
    return fail("no LLVM target for " + triple + ": " + error);
  llvm::TargetOptions targetOptions;
  // For a GPU the host code only launches kernels and moves descriptors:
  // its machine code is generated without optimization (the IR is still
  // optimized below). A deep model's train step holds every parameter's
  // descriptor across a call per layer, and the optimizing register
  // allocator took minutes on it (48 layers: 142 s of a 3 min compile).
  llvm::CodeGenOptLevel codegenLevel =
      gpu ? llvm::CodeGenOptLevel::None : llvm::CodeGenOptLevel::Default;
  std::unique_ptr<llvm::TargetMachine> machine(llvmTarget->createTargetMachine(
      llvm::Triple(triple), "x86-64-v2", "", targetOptions, llvm::Reloc::PIC_,
      std::nullopt, codegenLevel));
  llvmModule->setTargetTriple(llvm::Triple(triple));
  llvmModule->setDataLayout(machine->createDataLayout());

  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(machine.get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2)
        .run(*llvmModule, mam);
  }

  if (!opts.emitLLVM.empty()) {
    auto out = openOutputFile(opts.emitLLVM, &error);
    if (!out)
      return fail(error);
    llvmModule->print(out->os(), nullptr);
    out->keep();
  }

  llvm::SmallString<128> object;
  int fd;
  if (auto ec =
          llvm::sys::fs::createTemporaryFile("moe-compile", "o", fd, object))
    return fail("cannot create a temporary object file: " + ec.message());
  llvm::FileRemover removeObject(object);
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    llvm::legacy::PassManager codegen;
    if (machine->addPassesToEmitFile(codegen, os, nullptr,
                                     llvm::CodeGenFileType::ObjectFile))
      return fail("the host target cannot emit object files");
    codegen.run(*llvmModule);
  }

  auto cc = findProgram(opts.linker);
  if (!cc)
    return fail("cannot find the linker driver '" + opts.linker +
                "' on PATH (set --linker)");
  // Write to a temporary next to the output, then rename: a failed link
  // leaves any previous artifact untouched.
  std::string partial = outputFile + ".partial";
  llvm::SmallVector<llvm::StringRef> args = {*cc,     "-shared",    "-o",
                                             partial, object.str(), "-lm"};
  std::string linkError;
  int rc =
      llvm::sys::ExecuteAndWait(*cc, args, std::nullopt, {}, 0, 0, &linkError);
  if (rc != 0) {
    llvm::sys::fs::remove(partial);
    return fail("linking " + outputFile + " failed" +
                (linkError.empty() ? "" : ": " + linkError));
  }
  if (auto ec = llvm::sys::fs::rename(partial, outputFile))
    return fail("cannot write " + outputFile + ": " + ec.message());
  return success();
}
