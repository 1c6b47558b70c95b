//===- Pipelines.cpp - named moe-mlir pipelines ---------------------------===//

#include "moe/Pipelines/Pipelines.h"
#include "moe/Conversion/MoEToGPU/DedicatedKernels.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/Pipelines/Passes.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"

#include <cstdlib>

using namespace mlir;

/// Both pipelines' common part: moe ops (reference or data-parallel form)
/// and whole-tensor ops to linalg, then buffers with deallocation.
static void addTensorLoweringAndBufferization(OpPassManager &pm, bool parallel,
                                              bool bufferReport) {
  moe::ConvertMoEToLinalgOptions lowering;
  lowering.parallel = parallel;
  pm.addPass(moe::createConvertMoEToLinalg(lowering));
  // GPU: the dedicated kernels' host functions inlined into their callers
  // (after the lowering has seen which rows their group-row arguments read;
  // their launches keep the kernels' names): one stream runs a whole
  // program, where -gpu-async-region would synchronize with the host around
  // every call, and bufferization sees one function.
  if (parallel) {
    // A kernel reading a dispatch's rows reads the tokens instead.
    pm.addPass(moe::createMoEGPUFuseRowGathers());
    pm.addPass(createInlinerPass());
  }
  // Elementwise arith/math on whole tensors -> linalg.generic; aggregate ops
  // (linalg.softmax) -> generics.
  pm.addNestedPass<func::FuncOp>(createConvertElementwiseToLinalgPass());
  pm.addNestedPass<func::FuncOp>(moe::createMoEDecomposeAggregates());
  // On GPUs, sums to (nearly) one value would run in (nearly) one thread.
  if (parallel)
    pm.addNestedPass<func::FuncOp>(moe::createMoEGPUSplitReductions());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  // On GPUs every generic is a kernel and a pass through memory: an
  // elementwise producer used once is fused into its consumer (quantize
  // and dequantize of a GEMM operand become one f32 -> bf16 pass, the
  // 8-bit tensor between them never written).
  if (parallel)
    pm.addNestedPass<func::FuncOp>(moe::createMoEGPUFuseElementwise());

  pm.addPass(moe::createMoEReadInsertedSlices());
  pm.addPass(moe::createMoESplitEmptyTensors());
  pm.addPass(moe::createMoEReadOnlyArguments());
  bufferization::OneShotBufferizePassOptions bufferization;
  bufferization.bufferizeFunctionBoundaries = true;
  bufferization.functionBoundaryTypeConversion =
      bufferization::LayoutMapOption::IdentityLayoutMap;
  pm.addPass(bufferization::createOneShotBufferizePass(bufferization));
  // Train steps write the new parameters and moments over the old ones.
  pm.addNestedPass<func::FuncOp>(moe::createMoEUpdateArgumentsInPlace());
  // Upstream's buffer deallocation pipeline, with the block-end deallocs
  // split (-moe-split-deallocs) before its simplification pairs their
  // thousands of operands.
  memref::ExpandReallocPassOptions expand;
  expand.emitDeallocs = false;
  pm.addPass(memref::createExpandReallocPass(expand));
  pm.addPass(createCanonicalizerPass());
  pm.addPass(bufferization::createOwnershipBasedBufferDeallocationPass());
  pm.addPass(createCanonicalizerPass());
  pm.addNestedPass<func::FuncOp>(moe::createMoESplitDeallocs());
  pm.addPass(bufferization::createBufferDeallocationSimplificationPass());
  pm.addPass(bufferization::createLowerDeallocationsPass());
  pm.addPass(createCSEPass());
  pm.addPass(createCanonicalizerPass());
  // bufferization.clone (from deallocation) -> memref.alloc + memref.copy.
  pm.addPass(createConvertBufferizationToMemRefPass());
  // Buffers allocated where their tensors were created and freed at the end
  // of the block: in a train step every one would live from the top of the
  // function to its return.
  pm.addNestedPass<func::FuncOp>(moe::createMoEBufferLifetimes());
  if (bufferReport)
    pm.addNestedPass<func::FuncOp>(moe::createMoEBufferReport());
}

void mlir::moe::buildCPUPipeline(OpPassManager &pm, bool bufferReport) {
  // Collectives over several ranks -> libmoert calls (one-rank exchanges are
  // left to -convert-moe-to-linalg, which copies).
  pm.addPass(moe::createConvertMoEToRuntime());
  addTensorLoweringAndBufferization(pm, /*parallel=*/false, bufferReport);
  pm.addNestedPass<func::FuncOp>(moe::createMoECopyToLinalg());
  pm.addNestedPass<func::FuncOp>(createConvertLinalgToLoopsPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createSCFToControlFlowPass());
  // f32 -> bf16 in integer ops (not every C library has __truncsfbf2).
  arith::ArithExpandOpsPassOptions expand;
  expand.includeBf16 = true;
  pm.addPass(arith::createArithExpandOpsPass(expand));
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createConvertMathToLibmPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  pm.addPass(createCanonicalizerPass());
}

/// Kernels link libdevice (math functions) from the CUDA toolkit, which MLIR
/// finds through CUDA_ROOT, CUDA_HOME or CUDA_PATH. When none is set, point
/// CUDA_HOME at the toolkit holding the ptxas or nvcc on PATH (or
/// /usr/local/cuda), so compiling does not depend on the caller's shell.
static void findCUDAToolkit() {
  for (const char *var : {"CUDA_ROOT", "CUDA_HOME", "CUDA_PATH"})
    if (const char *v = std::getenv(var); v && *v)
      return;
  for (const char *tool : {"ptxas", "nvcc"}) {
    if (auto path = llvm::sys::findProgramByName(tool)) {
      llvm::SmallString<256> root(*path);
      llvm::sys::path::remove_filename(root); // .../bin
      llvm::sys::path::remove_filename(root); // the toolkit
      ::setenv("CUDA_HOME", root.c_str(), /*overwrite=*/0);
      return;
    }
  }
  if (llvm::sys::fs::exists("/usr/local/cuda/nvvm/libdevice"))
    ::setenv("CUDA_HOME", "/usr/local/cuda", 0);
}

void mlir::moe::buildGPUKernelSelection(OpPassManager &pm,
                                        const GPUPipelineOptions &options) {
  // Collectives over several ranks -> libmoert calls, as on the CPU. They
  // stay on the host with memref descriptors of device buffers
  // (-moe-gpu-device-buffers leaves calls alone); -gpu-async-region
  // synchronizes the program's stream before each call and starts a new one
  // after it, and libmoert runs the exchange on device memory (NCCL).
  pm.addPass(moe::createConvertMoEToRuntime());
  // moe.experts regions have no data-parallel form: group them first.
  pm.addNestedPass<func::FuncOp>(moe::createMoEGroupExperts());
  // Ops with a kernel for this chip (Blackwell: MXFP8 grouped GEMMs on the
  // block-scaled tcgen05 MMA; Hopper sm_90a: bf16 grouped GEMMs on wgmma)
  // become calls of those kernels; the rest takes the generic data-parallel
  // path of buildGPUPipeline.
  moe::MoEGPUDedicatedKernelsOptions dedicated;
  dedicated.chip = options.chip;
  dedicated.fp8Mma = options.mxfp8FP8MMA;
  dedicated.fp8blockExact = options.fp8blockExact;
  dedicated.flashDkvOverlap = options.flashDkvOverlap;
  dedicated.pairRoundTrips = options.pairRoundTrips;
  dedicated.mxActivations = options.mxActivations;
  dedicated.report = options.kernelReport;
  if (!moe::hasDedicatedGPUKernels(options.chip)) {
    // Only to say so (the program is unchanged).
    if (options.kernelReport)
      pm.addPass(moe::createMoEGPUDedicatedKernels(dedicated));
    return;
  }
  // Fused expert MLPs as their GEMMs (the same results, by definition),
  // so that those GEMMs get the chip's kernels too.
  pm.addPass(moe::createMoEExpandGroupedMlp());
  // Identical quantizations (a forward and its recomputation) merged, so
  // that the kernels see identical GEMMs; across a called layer's forward
  // and backward too (the backward's recomputed up projection is the
  // forward's).
  pm.addPass(createCSEPass());
  pm.addPass(moe::createMoEReuseForwardValues());
  // Weight gradients where they hold the least memory (after the data
  // gradients' combines, which free the expert rows' gradients).
  pm.addNestedPass<func::FuncOp>(moe::createMoEPlaceWeightGradients());
  pm.addPass(moe::createMoEGPUDedicatedKernels(dedicated));
  // GEMMs sharing an MX weight (the chunks of an expert-parallel layer, a
  // forward and its recomputation) share its dequantization. A called
  // layer's backward reads the forward's flash-attention output and
  // logsumexp instead of running the forward kernel again.
  pm.addPass(createCSEPass());
  pm.addPass(moe::createMoEReuseForwardValues());
}

void mlir::moe::buildGPUPipeline(OpPassManager &pm,
                                 const GPUPipelineOptions &options) {
  findCUDAToolkit();
  buildGPUKernelSelection(pm, options);
  addTensorLoweringAndBufferization(pm, /*parallel=*/true,
                                    options.bufferReport);
  pm.addPass(createCanonicalizerPass());

  pm.addNestedPass<func::FuncOp>(moe::createMoECopyToLinalg());
  moe::MoEGPUMapLoopsOptions mapping;
  mapping.blockSize = options.blockSize;
  pm.addNestedPass<func::FuncOp>(moe::createMoEGPUMapLoops(mapping));
  pm.addNestedPass<func::FuncOp>(createGpuMapParallelLoopsPass());
  pm.addPass(createConvertParallelLoopToGpuPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(moe::createMoEGPUDeviceBuffers());
  // Generic kernels named for the model part they belong to (profiles).
  pm.addNestedPass<func::FuncOp>(moe::createMoEGPUNameKernels());
  // Constants used in kernels stay in them instead of becoming kernel
  // parameters (outlining alone passes every value from above).
  pm.addNestedPass<func::FuncOp>(moe::createMoEGPUSinkIndexComputations());
  pm.addPass(createGpuKernelOutliningPass());
  // Each layer's copy of a kernel compiled once.
  pm.addPass(moe::createMoEGPUMergeKernels());
  if (options.trafficReport)
    pm.addPass(moe::createMoEGPUTrafficReport());
  // Warp-specialized kernels' setmaxnreg honoured by ptxas.
  pm.addPass(moe::createMoEGPUKernelBounds());
  pm.addNestedPass<func::FuncOp>(createGpuAsyncRegionPass());
  pm.addNestedPass<func::FuncOp>(moe::createMoEGPUElideHostSyncs());

  gpu::GPUToNVVMPipelineOptions nvvm;
  nvvm.cubinChip = stringifyGPUChip(options.chip).str();
  std::string features = options.features;
  if (features.empty()) {
    // Blackwell (sm_100a and later) needs PTX ISA 8.6; its block-scaled
    // MMA (tcgen05.mma...block_scale, whose default scale vector ptxas 13
    // reads as `.block32`) needs 8.8.
    StringRef chip = stringifyGPUChip(options.chip);
    unsigned number = 0;
    features = chip.consume_front("sm_") && !chip.consumeInteger(10, number) &&
                       number >= 100
                   ? "+ptx88"
                   : "+ptx80";
  }
  nvvm.cubinFeatures = features;
  nvvm.cubinFormat = stringifyKernelFormat(options.format).str();
  gpu::buildLowerToNVVMPassPipeline(pm, nvvm);
}

std::string
mlir::moe::GPUPipelineOptions::flagsHelp(ArrayRef<StringRef> skip) const {
  SmallVector<llvm::cl::Option *> options;
  for (auto &entry : OptionsMap)
    if (!llvm::is_contained(skip, entry.first))
      options.push_back(entry.second);
  llvm::sort(options, [](llvm::cl::Option *a, llvm::cl::Option *b) {
    return a->ArgStr < b->ArgStr;
  });
  std::string text;
  for (llvm::cl::Option *o : options) {
    text += "  --" + o->ArgStr.str();
    if (o->getValueExpectedFlag() == llvm::cl::ValueRequired)
      text += "=<value>";
    text += "\n";
    // The description, wrapped at 76 columns.
    std::string line = "     ";
    for (StringRef word : llvm::split(o->HelpStr, ' ')) {
      if (line.size() + word.size() + 1 > 76) {
        text += line + "\n";
        line = "     ";
      }
      line += " " + word.str();
    }
    text += line + "\n";
  }
  return text;
}

void mlir::moe::buildTrainPipeline(OpPassManager &pm,
                                   const TrainPipelineOptions &options) {
  pm.addNestedPass<func::FuncOp>(moe::createMoEGroupExperts());
  pm.addPass(createCanonicalizerPass());
  moe::MoEExpertParallelOptions parallel;
  parallel.epSize = options.epSize;
  parallel.dpSize = options.dpSize;
  parallel.chunks = options.epChunks;
  const bool sharded = options.epSize != 1 || options.dpSize != 1;
  // Dense GEMMs on the grouped kernels, in the recipe's dense precision
  // (before differentiation: their gradients are grouped GEMMs too).
  if (options.recipe != "none" && options.dense != "none")
    pm.addNestedPass<func::FuncOp>(moe::createMoEDenseToGrouped());
  if (options.autodiff) {
    // Shard the forward, differentiate (the exchanges' gradients are the
    // reverse exchanges), then sum the data-parallel gradients.
    if (sharded)
      pm.addPass(moe::createMoEExpertParallel(parallel));
    moe::MoEAutodiffOptions autodiff;
    autodiff.recompute = options.recompute;
    pm.addPass(moe::createMoEAutodiff(autodiff));
    if (sharded) {
      pm.addPass(moe::createMoEExpertParallel(parallel));
      moe::MoEBucketAllReduceOptions buckets;
      buckets.bucketMiB = options.gradBucketMiB;
      pm.addNestedPass<func::FuncOp>(moe::createMoEBucketAllReduce(buckets));
    }
    if (options.lossChunkRows != 0) { // (negative: the pass refuses it)
      moe::MoEChunkLossOptions chunk;
      chunk.rows = options.lossChunkRows;
      pm.addNestedPass<func::FuncOp>(moe::createMoEChunkLoss(chunk));
    }
  }
  if (options.recipe != "none") {
    moe::MoEQuantizeOptions quantize;
    quantize.recipe = options.recipe;
    quantize.scale = options.scale;
    quantize.blockScales = options.blockScales;
    quantize.keepFirstLast = options.keepFirstLast;
    // (none: nothing is marked dense; an unknown name is refused there.)
    quantize.dense = options.dense == "none" ? std::string("bf16")
                                             : std::string(options.dense);
    pm.addPass(moe::createMoEQuantize(quantize));
  }
  pm.addPass(moe::createMoEFuseGroupedMlp());
  if (sharded && !options.autodiff)
    pm.addPass(moe::createMoEExpertParallel(parallel));
  // Rows are quantized (MXFP8) or narrowed (bf16) before dispatch and
  // exchange move them: a quarter or half of the bytes, T tokens converted
  // instead of T * k copies.
  if (options.recipe != "none")
    pm.addNestedPass<func::FuncOp>(moe::createMoEHoistQuantize());
  // The backward of each called layer reads the forward's bf16 operands
  // (and other values both compute) instead of computing them again.
  if (options.autodiff)
    pm.addPass(moe::createMoEReuseForwardValues());
  if (options.optimizer == TrainPipelineOptions::Optimizer::AdamW)
    pm.addPass(moe::createMoEAdamW());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void mlir::moe::registerMoEPipelines() {
  PassPipelineRegistration<TrainPipelineOptions>(
      "moe-train-pipeline",
      "The moe training transformations: group experts, precision recipe "
      "(mxfp8|bf16|fp8-blockwise|none), fuse expert MLPs, expert parallelism "
      "(ep-size), "
      "and with autodiff=true the train step of every loss function",
      buildTrainPipeline);
  PassPipelineRegistration<GPUPipelineOptions>(
      "moe-gpu-pipeline",
      "Lower moe programs to the LLVM dialect with embedded NVIDIA GPU kernels "
      "(data-parallel moe lowering, bufferization, loops mapped to blocks and "
      "threads, device buffers, NVVM, PTX/cubin)",
      buildGPUPipeline);
  PassPipelineRegistration<GPUPipelineOptions>(
      "moe-gpu-select-kernels",
      "The GPU pipeline's first part: moe ops with a kernel for the chip "
      "become calls of generated kernels, on tensors (kernel-report=true: "
      "why the others do not)",
      buildGPUKernelSelection);
  PassPipelineRegistration<>(
      "moe-cpu-pipeline",
      "Lower moe programs to the LLVM dialect for the host CPU (reference "
      "semantics: convert-moe-to-runtime for collectives over several ranks, "
      "convert-moe-to-linalg, one-shot bufferization, loops, LLVM)",
      [](OpPassManager &pm) { buildCPUPipeline(pm); });
}
