// -moe-gpu-dedicated-kernels{report}: every op of a kind the chip's kernels
// compute that stays on the generic kernels gets a remark naming why, and so
// does a GEMM on the cp.async kernel; a matrix-vector product takes the
// matrix-vector kernel (or says why not); the module gets the count.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a report=true" -o %t.mlir 2>&1 | FileCheck %s
// RUN: FileCheck %s --check-prefix=IR --input-file=%t.mlir
// The pipeline option and moe-compile's flag say the same.
// RUN: moe-opt %s --moe-gpu-select-kernels="chip=sm_90a kernel-report=true" -o /dev/null 2>&1 | FileCheck %s
// RUN: moe-compile %s --target=sm_90a --kernel-report --kernel-format=isa -o %t.so 2>&1 | FileCheck %s
// Without report, nothing is said.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a" -o /dev/null 2>&1 | count 0
// A chip without dedicated kernels says so.
// RUN: moe-opt %s --moe-gpu-select-kernels="chip=sm_80 kernel-report=true" -o /dev/null 2>&1 | FileCheck %s --check-prefix=NONE
// NONE: remark: no dedicated kernels for sm_80: every op takes the generic kernels
// RUN: not moe-compile %s --target=cpu --kernel-report -o %t.cpu.so 2>&1 | FileCheck %s --check-prefix=CPU
// CPU: GPU options ('kernel-report') given for target cpu

// CHECK-DAG: kernel-report.mlir:[[@LINE+3]]:{{[0-9]+}}: remark: moe.grouped_matmul (tensor<256x128xf32>): generic kernels on sm_90a: the lhs is f32: the wgmma kernels take bf16 or MX operands (a precision recipe, bf16 or mxfp8)
func.func @f32_gemm(%x: tensor<256x64xf32>, %w: tensor<2x64x128xf32>) -> tensor<256x128xf32> {
  %o = arith.constant dense<[0, 100, 256]> : tensor<3xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<256x64xf32>, tensor<2x64x128xf32>, tensor<3xi32> -> tensor<256x128xf32>
  return %y : tensor<256x128xf32>
}

// CHECK-DAG: kernel-report.mlir:[[@LINE+3]]:{{[0-9]+}}: remark: moe.grouped_matmul (tensor<256x128xf32>): the cp.async wgmma kernel, not the TMA one: N = 128 is under 256 and not a multiple of it (the TMA kernel's column tile)
func.func @narrow_gemm(%x: tensor<256x64xbf16>, %w: tensor<2x64x128xbf16>) -> tensor<256x128xf32> {
  %o = arith.constant dense<[0, 100, 256]> : tensor<3xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<256x64xbf16>, tensor<2x64x128xbf16>, tensor<3xi32> -> tensor<256x128xf32>
  return %y : tensor<256x128xf32>
}

// K and N of 60: padded to 64 for the TMA kernel, no remark.
// IR-LABEL: func.func @padded_gemm
// IR: tensor.pad %{{.*}} low[0, 0] high[0, 4]
// IR: } : tensor<256x60xbf16> to tensor<256x64xbf16>
// IR: tensor.pad %{{.*}} low[0, 0, 0] high[0, 4, 4]
// IR: } : tensor<1x60x60xbf16> to tensor<1x64x64xbf16>
// IR: call @moe_wgmma_gmm_256x64x64_e1_bf16_i32_tma(
// IR: tensor.extract_slice %{{.*}}[0, 0] [256, 60] [1, 1] : tensor<256x64xf32> to tensor<256x60xf32>
func.func @padded_gemm(%x: tensor<256x60xbf16>, %w: tensor<1x60x60xbf16>) -> tensor<256x60xf32> {
  %o = arith.constant dense<[0, 256]> : tensor<2xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<256x60xbf16>, tensor<1x60x60xbf16>, tensor<2xi32> -> tensor<256x60xf32>
  return %y : tensor<256x60xf32>
}

// A row sum as a GEMM with one column: the matrix-vector kernel, nothing
// said of the tile GEMMs.
// IR-LABEL: func.func @row_sum
// IR: call @moe_matvec_256x64x1_e1_bf16_bf16_i32
func.func @row_sum(%x: tensor<256x64xbf16>, %w: tensor<1x64x1xbf16>) -> tensor<256x1xf32> {
  %o = arith.constant dense<[0, 256]> : tensor<2xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<256x64xbf16>, tensor<1x64x1xbf16>, tensor<2xi32> -> tensor<256x1xf32>
  return %y : tensor<256x1xf32>
}

// A matrix-vector product the kernel does not take says so.
// CHECK-DAG: kernel-report.mlir:[[@LINE+3]]:{{[0-9]+}}: remark: moe.grouped_matmul (tensor<256x2xf32>): generic kernels on sm_90a: a f16 lhs and bf16 rhs (the matrix-vector kernel takes f32 or bf16)
func.func @f16_matvec(%x: tensor<256x64xf16>, %w: tensor<1x64x2xbf16>) -> tensor<256x2xf32> {
  %o = arith.constant dense<[0, 256]> : tensor<2xi32>
  %y = moe.grouped_matmul %x, %w, %o
      : tensor<256x64xf16>, tensor<1x64x2xbf16>, tensor<2xi32> -> tensor<256x2xf32>
  return %y : tensor<256x2xf32>
}

// CHECK-DAG: kernel-report.mlir:[[@LINE+3]]:{{[0-9]+}}: remark: moe.grouped_matmul_wgrad (tensor<2x64x128xf32>): generic kernels on sm_90a: the rhs is f32: the wgmma kernels take bf16 or MX operands (a precision recipe, bf16 or mxfp8)
func.func @f32_wgrad(%x: tensor<256x64xbf16>, %dy: tensor<256x128xf32>) -> tensor<2x64x128xf32> {
  %o = arith.constant dense<[0, 100, 256]> : tensor<3xi32>
  %g = moe.grouped_matmul_wgrad %x, %dy, %o
      : tensor<256x64xbf16>, tensor<256x128xf32>, tensor<3xi32> -> tensor<2x64x128xf32>
  return %g : tensor<2x64x128xf32>
}

// CHECK-DAG: kernel-report.mlir:[[@LINE+2]]:{{[0-9]+}}: remark: moe.attention (tensor<1x64x4x96xf32>): generic kernels on sm_90a: head dim 96: the flash kernels take 64 or 128
func.func @attention_dim_96(%q: tensor<1x64x4x96xbf16>, %k: tensor<1x64x2x96xbf16>, %v: tensor<1x64x2x96xbf16>) -> tensor<1x64x4x96xf32> {
  %o = moe.attention %q, %k, %v causal : tensor<1x64x4x96xbf16>, tensor<1x64x2x96xbf16>, tensor<1x64x2x96xbf16> -> tensor<1x64x4x96xf32>
  return %o : tensor<1x64x4x96xf32>
}

// CHECK-DAG: kernel-report.mlir:[[@LINE+2]]:{{[0-9]+}}: remark: moe.attention (tensor<1x64x4x64xf32>): generic kernels on sm_90a: f32 inputs: the flash kernels take bf16 (a precision recipe, bf16 or mxfp8)
func.func @attention_f32(%q: tensor<1x64x4x64xf32>, %k: tensor<1x64x2x64xf32>, %v: tensor<1x64x2x64xf32>) -> tensor<1x64x4x64xf32> {
  %o = moe.attention %q, %k, %v causal : tensor<1x64x4x64xf32>, tensor<1x64x2x64xf32>, tensor<1x64x2x64xf32> -> tensor<1x64x4x64xf32>
  return %o : tensor<1x64x4x64xf32>
}

// CHECK-DAG: kernel-report.mlir:[[@LINE+2]]:{{[0-9]+}}: remark: linalg.matmul (tensor<?x64xf32>): generic kernels on sm_90a: a dynamic shape (the kernels are generated for static shapes)
func.func @dynamic_matmul(%a: tensor<?x32xf32>, %b: tensor<32x64xf32>, %c: tensor<?x64xf32>) -> tensor<?x64xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<?x32xf32>, tensor<32x64xf32>) outs(%c : tensor<?x64xf32>) -> tensor<?x64xf32>
  return %r : tensor<?x64xf32>
}

// An expert MLP of 100 rows (under the TMA kernel's 128; whole tiles):
// both GEMMs on the cp.async kernel, which has no epilogues, so the SwiGLU
// and the MX rounding run separately.
// CHECK-DAG: kernel-report.mlir:[[@LINE+4]]:{{[0-9]+}}: remark: moe.grouped_matmul (tensor<100x512xf32>): the cp.async wgmma kernel, not the TMA one: 100 rows, under the TMA kernel's 128
// CHECK-DAG: kernel-report.mlir:[[@LINE+3]]:{{[0-9]+}}: remark: moe.grouped_matmul (tensor<100x512xf32>): its SwiGLU (and the rounding after it) on the generic kernels, not in this GEMM's epilogue: the GEMM is on the cp.async kernel, which has no epilogues
func.func @mlp_unfused(%x: tensor<100x128xbf16>, %w1: tensor<3x128x512xbf16>,
                       %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>) -> tensor<100x256xf32> {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<100x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<100x512xf32>
  %a = moe.swiglu %h : tensor<100x512xf32> -> tensor<100x256xf32>
  %q = moe.quantize %a : tensor<100x256xf32> -> !moe.mx<100x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off
      : !moe.mx<100x256xf8E4M3FN, axis = 1>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<100x256xf32>
  return %y : tensor<100x256xf32>
}

// CHECK: remark: kernels for sm_90a: 6 calls of 6 dedicated kernels; 6 ops on the generic kernels, 3 on a slower kernel than their family's best
