//===- Pipelines.h - named moe-mlir pipelines -------------------*- C++ -*-===//
#ifndef MOE_PIPELINES_PIPELINES_H
#define MOE_PIPELINES_PIPELINES_H

#include "moe/Conversion/MoEToGPU/GPUOptions.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir::moe {

/// `moe` + tensor-level upstream IR -> the LLVM dialect, for the host CPU:
/// convert-moe-to-runtime (collectives over several ranks -> libmoert
/// calls), convert-moe-to-linalg, bufferization, loops, LLVM.
void buildCPUPipeline(OpPassManager &pm, bool bufferReport = false);

/// Options of the GPU pipeline: the one declaration of the GPU compile
/// options. `-moe-gpu-pipeline="..."` parses them; moe-compile takes each as
/// a flag of its own (`--pair-round-trips=always`) and the C API and the
/// Python package as text in this syntax (`pair-round-trips=always`), which
/// compileToSharedObject parses into this struct.
struct GPUPipelineOptions : public PassPipelineOptions<GPUPipelineOptions> {
  PassOptions::Option<GPUChip> chip{
      *this, "chip",
      llvm::cl::desc("The GPU architecture (sm_90a: H100/H200; sm_100a: "
                     "B200)"),
      llvm::cl::init(GPUChip::sm_90a), GPUChipValues()};
  PassOptions::Option<std::string> features{
      *this, "features",
      llvm::cl::desc("PTX version to target (default: +ptx80 for sm_90a, "
                     "+ptx88 for Blackwell chips sm_100a and later)"),
      llvm::cl::init("")};
  PassOptions::Option<KernelFormat> format{
      *this, "format",
      llvm::cl::desc("Kernel binary format: isa (PTX text, JIT-compiled by the "
                     "driver), bin (cubin, needs ptxas) or fatbin"),
      llvm::cl::init(KernelFormat::isa), KernelFormatValues()};
  PassOptions::Option<bool> mxfp8FP8MMA{
      *this, "mxfp8-fp8-mma",
      llvm::cl::desc("Hopper: MXFP8 grouped GEMMs on FP8 wgmma per 32-wide K "
                     "slice (not exact: the tensor core sums a slice's FP8 "
                     "products at reduced precision, about 5e-5 relative; "
                     "and slower than the exact default, which dequantizes "
                     "to bf16 for the TMA wgmma kernel)"),
      llvm::cl::init(false)};
  PassOptions::Option<bool> fp8blockExact{
      *this, "fp8block-exact",
      llvm::cl::desc("Hopper: blockwise FP8 grouped GEMMs dequantized to bf16 "
                     "for the bf16 wgmma kernels (exact with power-of-two "
                     "scales, about 3.5x slower) instead of FP8 wgmma "
                     "promoted every 128 of K (the recipe's arithmetic, "
                     "about 1.3e-4 relative off the exact result)"),
      llvm::cl::init(false)};
  PassOptions::Option<bool> flashDkvOverlap{
      *this, "flash-dkv-overlap",
      llvm::cl::desc("Hopper: the flash dK/dV kernel overlaps its MMAs with "
                     "the softmax gradient "
                     "(-moe-gpu-dedicated-kernels{flash-dkv-overlap})"),
      llvm::cl::init(false)};
  PassOptions::Option<RoundTripPairing> pairRoundTrips{
      *this, "pair-round-trips",
      llvm::cl::desc("Hopper: when the two MX round trips of a weight or of "
                     "an expert's rows share one kernel: peak (unless holding "
                     "the second result longer raises the peak of live "
                     "tensors; the least memory) or always (each tensor read "
                     "once; the fastest)"),
      llvm::cl::init(RoundTripPairing::peak), RoundTripPairingValues()};
  PassOptions::Option<MXActivations> mxActivations{
      *this, "mx-activations",
      llvm::cl::desc("Hopper: where the expert GEMMs read their SwiGLU "
                     "epilogues' MX activations 8-bit instead of as bf16: "
                     "peak (where that lowers the peak of live tensors) or "
                     "always (the least memory; those GEMMs are 10-18% "
                     "slower, and the backward SwiGLU epilogue also rounds "
                     "dh columnwise where that lowers the peak, which "
                     "more than doubles its time)"),
      llvm::cl::init(MXActivations::peak), MXActivationsValues()};
  PassOptions::Option<int64_t> blockSize{
      *this, "block-size",
      llvm::cl::desc("Threads per block of the generic kernels"),
      llvm::cl::init(128)};
  /// These options as a tool's flags (`--name=<value>` and the
  /// description, sorted by name), leaving out those named in `skip`.
  std::string flagsHelp(ArrayRef<StringRef> skip = {}) const;

  PassOptions::Option<bool> kernelReport{
      *this, "kernel-report",
      llvm::cl::desc("Print a remark at every GEMM, weight gradient, "
                     "attention, cross-entropy or dequantize that stays on "
                     "the generic kernels, and at every GEMM on the cp.async "
                     "wgmma kernel instead of the TMA one or whose SwiGLU "
                     "its epilogue cannot take, naming why; then "
                     "the count of kernel calls "
                     "(-moe-gpu-dedicated-kernels{report})"),
      llvm::cl::init(false)};
  PassOptions::Option<bool> bufferReport{
      *this, "buffer-report",
      llvm::cl::desc("Print each function's peak of live buffers (bytes "
                     "allocated and not yet freed, in program order) and the "
                     "largest of them (-moe-buffer-report)"),
      llvm::cl::init(false)};
  PassOptions::Option<bool> trafficReport{
      *this, "traffic-report",
      llvm::cl::desc("Print the bytes each generic kernel reads and writes, "
                     "whole buffers counted once (-moe-gpu-traffic-report; "
                     "bench/kernel_traffic.py joins them with a profile)"),
      llvm::cl::init(false)};
};

/// `moe` + tensor-level upstream IR -> the LLVM dialect with embedded GPU
/// kernels: the data-parallel moe lowering, bufferization, loops mapped to
/// blocks and threads, device buffers, NVVM, PTX.
void buildGPUPipeline(OpPassManager &pm, const GPUPipelineOptions &options);

/// The GPU pipeline's first part, on tensors: ops with a kernel for the
/// chip become calls of generated kernels (-moe-gpu-dedicated-kernels and
/// the passes that prepare for it). Registered as `-moe-gpu-select-kernels`
/// to see which ops get which kernel (`kernel-report=true` says why not).
void buildGPUKernelSelection(OpPassManager &pm,
                             const GPUPipelineOptions &options);

/// Options of the training pipeline.
struct TrainPipelineOptions : public PassPipelineOptions<TrainPipelineOptions> {
  PassOptions::Option<int64_t> epSize{
      *this, "ep-size",
      llvm::cl::desc("Ranks the experts are spread over (1: no expert "
                     "parallelism)"),
      llvm::cl::init(1)};
  PassOptions::Option<int64_t> dpSize{
      *this, "dp-size",
      llvm::cl::desc("Data-parallel copies of the expert-parallel group: the "
                     "step runs on dp-size x ep-size ranks (1: none)"),
      llvm::cl::init(1)};
  PassOptions::Option<int64_t> gradBucketMiB{
      *this, "grad-bucket-mib",
      llvm::cl::desc("With autodiff on several ranks: the gradients summed "
                     "over the ranks a bucket of this many MiB at a time, "
                     "each as soon as it is computed (-moe-bucket-all-reduce; "
                     "0: one sum per gradient)"),
      llvm::cl::init(32)};
  PassOptions::Option<int64_t> epChunks{
      *this, "ep-chunks",
      llvm::cl::desc("With ep-size > 1: chunks of tokens per layer, so that "
                     "one chunk's exchange overlaps another's experts "
                     "(-moe-expert-parallel{chunks})"),
      llvm::cl::init(1)};
  PassOptions::Option<std::string> recipe{
      *this, "recipe",
      llvm::cl::desc(
          "Expert GEMM precision: mxfp8, bf16, fp8-blockwise, or none (as "
          "written)"),
      llvm::cl::init("mxfp8")};
  PassOptions::Option<std::string> dense{
      *this, "dense",
      llvm::cl::desc(
          "Under a recipe (not none), at any ep-size: the dense GEMMs "
          "(projections, router, shared experts, LM head; -moe-dense-to-"
          "grouped) run on the grouped GEMM kernels in bf16 (default), "
          "mxfp8 or fp8-blockwise; none keeps them as written"),
      llvm::cl::init("bf16")};
  PassOptions::Option<std::string> scale{
      *this, "scale", llvm::cl::desc("MX scale choice: rceil or floor"),
      llvm::cl::init("rceil")};
  PassOptions::Option<std::string> blockScales{
      *this, "block-scales",
      llvm::cl::desc("fp8-blockwise scales: pow2 or f32"),
      llvm::cl::init("pow2")};
  PassOptions::Option<bool> keepFirstLast{
      *this, "keep-first-last",
      llvm::cl::desc("Keep the first and last layer (moe.layer) in high "
                     "precision"),
      llvm::cl::init(false)};
  PassOptions::Option<bool> autodiff{
      *this, "autodiff",
      llvm::cl::desc("Derive the train step of every loss function "
                     "(-moe-autodiff) before the precision recipe"),
      llvm::cl::init(false)};
  PassOptions::Option<bool> recompute{
      *this, "recompute",
      llvm::cl::desc("With autodiff: each called function (a decoder layer "
                     "of moe-model --layer-functions) is recomputed before "
                     "its backward instead of holding its activations "
                     "(-moe-autodiff{recompute})"),
      llvm::cl::init(false)};
  PassOptions::Option<int64_t> lossChunkRows{
      *this, "loss-chunk-rows",
      llvm::cl::desc("With autodiff, under a recipe (the LM head on the "
                     "grouped GEMMs): the LM head, its cross-entropy and "
                     "their backward in chunks of this many tokens, so no "
                     "[tokens, vocab] tensor is held (-moe-chunk-loss; 0: "
                     "one chunk)"),
      llvm::cl::init(0)};
  enum class Optimizer { None, AdamW };
  PassOptions::Option<Optimizer> optimizer{
      *this, "optimizer",
      llvm::cl::desc("With autodiff: the optimizer update in the train step"),
      llvm::cl::init(Optimizer::None),
      llvm::cl::values(clEnumValN(Optimizer::None, "none",
                                  "the step returns the gradients (@<f>_grad)"),
                       clEnumValN(Optimizer::AdamW, "adamw",
                                  "clipping and AdamW in the step (-moe-adamw: "
                                  "@<f>_grad becomes @<f>_step)"))};
};

/// The moe-level training transformations, in order: group the experts into
/// grouped ops, apply the precision recipe, fuse the expert MLPs (forward
/// and backward), shard the experts over `ep-size` ranks. With `autodiff`:
/// group, shard, -moe-autodiff (gradients cross the ranks back), sum the
/// data-parallel gradients, then the recipe (forward and backward GEMMs)
/// and fusion. The result is still `moe` IR; lower it with
/// -moe-cpu-pipeline or -moe-gpu-pipeline.
void buildTrainPipeline(OpPassManager &pm, const TrainPipelineOptions &options);

/// Registers the named pipelines (`-moe-train-pipeline`, `-moe-cpu-pipeline`,
/// `-moe-gpu-pipeline`).
void registerMoEPipelines();

} // namespace mlir::moe

#endif
