// moe.dequantize of an MX tensor that is not a round trip (MX inputs,
// dispatched or exchanged MX data, Hopper's exact MXFP8 GEMM operands)
// becomes one kernel on the data and scales: the IR
// -moe-gpu-dedicated-kernels produces, the PTX, and ptxas accepting it.
// test/Integration/GPU/kernels.mlir runs it against the CPU (bit-identical).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_100a | FileCheck %s --check-prefix=SM100
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_80 | FileCheck %s --check-prefix=NOKERNEL

// VERIFY: ptxas accepted 3 kernel modules for sm_90a
// NOKERNEL-NOT: moe_mx_dequantize
// SM100: call @moe_mx_dequantize_128x256_a1_e4m3_to_f32(

// Blocks along the innermost dim: the data and scales of the packed value.
// CHECK-LABEL: func.func @rows
// CHECK: %[[D:.*]], %[[S:.*]] = moe.mx_unpack
// CHECK: %[[Y:.*]] = call @moe_mx_dequantize_128x256_a1_e4m3_to_f32(%[[D]], %[[S]]) : (tensor<128x256xf8E4M3FN>, tensor<128x8xf8E8M0FNU>) -> tensor<128x256xf32>
// CHECK-NOT: moe.dequantize
// CHECK: return %[[Y]]
func.func @rows(%d: tensor<128x256xf8E4M3FN>, %s: tensor<128x8xf8E8M0FNU>) -> tensor<128x256xf32> {
  %q = moe.mx_pack %d, %s : tensor<128x256xf8E4M3FN>, tensor<128x8xf8E8M0FNU>
      -> !moe.mx<128x256xf8E4M3FN, axis = 1>
  %y = moe.dequantize %q : !moe.mx<128x256xf8E4M3FN, axis = 1> -> tensor<128x256xf32>
  return %y : tensor<128x256xf32>
}

// Blocks along K of a weight [E, K, N] (the scales of 8 consecutive columns
// are 8 consecutive bytes), to bf16.
// CHECK-LABEL: func.func @weights
// CHECK: call @moe_mx_dequantize_4x64x96_a1_e5m2_to_bf16(
func.func @weights(%d: tensor<4x64x96xf8E5M2>, %s: tensor<4x2x96xf8E8M0FNU>) -> tensor<4x64x96xbf16> {
  %q = moe.mx_pack %d, %s : tensor<4x64x96xf8E5M2>, tensor<4x2x96xf8E8M0FNU>
      -> !moe.mx<4x64x96xf8E5M2, axis = 1>
  %y = moe.dequantize %q : !moe.mx<4x64x96xf8E5M2, axis = 1> -> tensor<4x64x96xbf16>
  return %y : tensor<4x64x96xbf16>
}

// The innermost dim not a multiple of 8: the generic path.
// CHECK-LABEL: func.func @odd
// CHECK: moe.dequantize
// CHECK-NOT: call @moe_mx_dequantize
func.func @odd(%d: tensor<64x36xf8E4M3FN>, %s: tensor<2x36xf8E8M0FNU>) -> tensor<64x36xf32> {
  %q = moe.mx_pack %d, %s : tensor<64x36xf8E4M3FN>, tensor<2x36xf8E8M0FNU>
      -> !moe.mx<64x36xf8E4M3FN, axis = 0>
  %y = moe.dequantize %q : !moe.mx<64x36xf8E4M3FN, axis = 0> -> tensor<64x36xf32>
  return %y : tensor<64x36xf32>
}

// CHECK-LABEL: func.func private @moe_mx_dequantize_128x256_a1_e4m3_to_f32(
// CHECK-SAME: moe.dedicated_kernel = "mx dequantize"
// 32768 elements, 8 a thread: 16 CTAs of 256 threads.
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c16, {{.*}}) threads({{.*}}) in ({{.*}} = %c256,
// CHECK: llvm.load {{.*}} : !llvm.ptr<1> -> vector<8xi8>
// CHECK-COUNT-4: nvvm.convert.f8x2.to.f16x2
// CHECK: llvm.store {{.*}} : vector<4xf32>, !llvm.ptr<1>
// CHECK: llvm.store {{.*}} : vector<4xf32>, !llvm.ptr<1>
// CHECK-LABEL: func.func private @moe_mx_dequantize_4x64x96_a1_e5m2_to_bf16(
// Eight scale bytes a thread (one per column).
// CHECK: llvm.load {{.*}} : !llvm.ptr<1> -> vector<8xi8>
// CHECK: llvm.load {{.*}} : !llvm.ptr<1> -> vector<8xi8>
// CHECK: llvm.store {{.*}} : vector<8xbf16>, !llvm.ptr<1>

// PTX-LABEL: kernel module moe_mx_dequantize_128x256_a1_e4m3_to_f32_kernel
// PTX: ld.global.v2.b32
// PTX: cvt.rn.f16x2.e4m3x2
// PTX: st.global.v4.{{[bf]}}32
// PTX-LABEL: kernel module moe_mx_dequantize_4x64x96_a1_e5m2_to_bf16_kernel
// PTX: cvt.rn.f16x2.e5m2x2
