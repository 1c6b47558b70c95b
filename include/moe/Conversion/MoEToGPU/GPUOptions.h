//===- GPUOptions.h - the GPU compile options' enums ------------*- C++ -*-===//
//
// The enums of GPUOptions.td (GPUChip, KernelFormat, RoundTripPairing,
// MXActivations) and the modifier that makes a command-line or pass option
// accept exactly their names.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_CONVERSION_MOETOGPU_GPUOPTIONS_H
#define MOE_CONVERSION_MOETOGPU_GPUOPTIONS_H

#include "mlir/IR/DialectImplementation.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/CommandLine.h"

#include <cstdint>
#include <optional>
#include <string>

#include "moe/Conversion/MoEToGPU/GPUOptions.h.inc"

namespace mlir::moe {

/// An option modifier (like llvm::cl::values) listing every name of the
/// TableGen enum `EnumT`: the option accepts those names and no others.
template <typename EnumT, std::optional<EnumT> (*Symbolize)(uint32_t)>
struct EnumOptionValues {
  template <class Opt> void apply(Opt &o) const {
    for (uint32_t i = 0; std::optional<EnumT> e = Symbolize(i); ++i)
      o.getParser().addLiteralOption(stringifyEnum(*e), *e, "");
  }
};
using GPUChipValues = EnumOptionValues<GPUChip, symbolizeGPUChip>;
using KernelFormatValues =
    EnumOptionValues<KernelFormat, symbolizeKernelFormat>;
using RoundTripPairingValues =
    EnumOptionValues<RoundTripPairing, symbolizeRoundTripPairing>;
using MXActivationsValues =
    EnumOptionValues<MXActivations, symbolizeMXActivations>;

/// Every GPU chip name, comma-separated (for messages).
std::string gpuChipNames();

} // namespace mlir::moe

#endif
