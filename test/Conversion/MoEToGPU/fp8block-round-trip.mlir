// Blockwise FP8 (!moe.fp8block) conversions on the dedicated kernel: a
// moe.dequantize of a moe.quantize becomes one round-trip kernel reading x
// once; a quantize whose data and scales are read becomes one kernel
// writing both. The IR -moe-gpu-dedicated-kernels produces, the PTX of the
// whole GPU pipeline and ptxas accepting it; test/Integration/GPU/fp8block.mlir
// runs them against the CPU on a GPU machine (bit-identical). The GEMMs here
// take the exact route (fp8block-exact: dequantized to bf16), whose round
// trips these are; hopper-tma-fp8block.mlir tests the FP8 wgmma one.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a fp8block-exact=true" | FileCheck %s
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_100a | FileCheck %s --check-prefix=BLACKWELL
// RUN: moe-compile %s --target=sm_90a --fp8block-exact --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_80 | FileCheck %s --check-prefix=NOKERNEL
// RUN: moe-opt %s --moe-gpu-select-kernels="chip=sm_90a fp8block-exact=true kernel-report=true" \
// RUN:   -o /dev/null 2>&1 | FileCheck %s --check-prefix=REPORT

// VERIFY: ptxas accepted 14 kernel modules for sm_90a
// NOKERNEL-NOT: moe_fp8block
// BLACKWELL: call @moe_fp8block_round_trip_300x260_t1x128_e4m3_pow2_f32_to_bf16

// 1 x 128 tiles along the innermost dim (partial last tile): a warp a row,
// 16-byte loads, the amax by five xor shuffles, no shared memory.
// CHECK-LABEL: func.func @rows
// CHECK-NOT: moe.quantize
// CHECK-NOT: moe.dequantize
// CHECK: %[[Y:.*]] = call @moe_fp8block_round_trip_300x260_t1x128_e4m3_pow2_f32_to_bf16(%arg0) : (tensor<300x260xf32>) -> tensor<300x260xbf16>
// CHECK: return %[[Y]]
// PTX-LABEL: kernel module moe_fp8block_round_trip_300x260_t1x128_e4m3_pow2_f32_to_bf16_kernel
// PTX: ld.global.v4.b32
// PTX-COUNT-5: shfl.sync.bfly.b32
// PTX-NOT: bar.sync
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX: st.global.v4.b16
func.func @rows(%x: tensor<300x260xf32>) -> tensor<300x260xbf16> {
  %q = moe.quantize %x : tensor<300x260xf32> -> !moe.fp8block<300x260xf8E4M3FN, block = [1, 128], pow2>
  %y = moe.dequantize %q : !moe.fp8block<300x260xf8E4M3FN, block = [1, 128], pow2> -> tensor<300x260xbf16>
  return %y : tensor<300x260xbf16>
}

// 128 x 1 tiles along the rows (the weight gradient's operands): each
// column's amax by two xor shuffles, then across the warps in shared memory.
// CHECK-LABEL: func.func @columns
// CHECK: call @moe_fp8block_round_trip_300x96_t128x1_e5m2_f32s_bf16_to_f32(%arg0)
// PTX-LABEL: kernel module moe_fp8block_round_trip_300x96_t128x1_e5m2_f32s_bf16_to_f32_kernel
// PTX: ld.global.v4.b16
// PTX-COUNT-2: shfl.sync.bfly.b32
// PTX: bar.sync
// PTX: st.shared.b32
// PTX: bar.sync
// PTX: ld.shared.b32
// PTX: cvt.rn.satfinite.e5m2x2.f32
func.func @columns(%x: tensor<300x96xbf16>) -> tensor<300x96xf32> {
  %q = moe.quantize %x : tensor<300x96xbf16> -> !moe.fp8block<300x96xf8E5M2, block = [128, 1]>
  %y = moe.dequantize %q : !moe.fp8block<300x96xf8E5M2, block = [128, 1]> -> tensor<300x96xf32>
  return %y : tensor<300x96xf32>
}

// 128 x 128 tiles of stacked weights, dequantized twice (the forward and
// the data gradient): one call.
// CHECK-LABEL: func.func @weights
// CHECK-NEXT: %[[W:.*]] = call @moe_fp8block_round_trip_4x200x136_t128x128_e4m3_pow2_f32_to_bf16(%arg0)
// CHECK-NEXT: return %[[W]], %[[W]]
// PTX-LABEL: kernel module moe_fp8block_round_trip_4x200x136_t128x128_e4m3_pow2_f32_to_bf16_kernel
// PTX-COUNT-5: shfl.sync.bfly.b32
// PTX: bar.sync
// PTX: ld.shared.b32
// PTX-COUNT-3: shfl.sync.bfly.b32
func.func @weights(%w: tensor<4x200x136xf32>) -> (tensor<4x200x136xbf16>, tensor<4x200x136xbf16>) {
  %q = moe.quantize %w : tensor<4x200x136xf32> -> !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128], pow2>
  %a = moe.dequantize %q : !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128], pow2> -> tensor<4x200x136xbf16>
  %b = moe.dequantize %q : !moe.fp8block<4x200x136xf8E4M3FN, block = [1, 128, 128], pow2> -> tensor<4x200x136xbf16>
  return %a, %b : tensor<4x200x136xbf16>, tensor<4x200x136xbf16>
}

// Columns that are not a multiple of 4: element-wise accesses.
// CHECK-LABEL: func.func @odd
// CHECK: call @moe_fp8block_round_trip_5x130_t1x128_e4m3_f32s_f32_to_f32(%arg0)
// PTX-LABEL: kernel module moe_fp8block_round_trip_5x130_t1x128_e4m3_f32s_f32_to_f32_kernel
// PTX-NOT: ld.global.v4
func.func @odd(%x: tensor<5x130xf32>) -> tensor<5x130xf32> {
  %q = moe.quantize %x : tensor<5x130xf32> -> !moe.fp8block<5x130xf8E4M3FN, block = [1, 128]>
  %y = moe.dequantize %q : !moe.fp8block<5x130xf8E4M3FN, block = [1, 128]> -> tensor<5x130xf32>
  return %y : tensor<5x130xf32>
}

// The data and scales are read (the FP8 wgmma kernel's operands): the
// quantize kernel writes both, and a NaN's code is the format's with x's
// sign.
// CHECK-LABEL: func.func @quantize
// CHECK: %[[Q:.*]]:2 = call @moe_fp8block_quantize_300x200_t128x1_e4m3_pow2_f32(%arg0) : (tensor<300x200xf32>) -> (tensor<300x200xf8E4M3FN>, tensor<3x200xf32>)
// CHECK: moe.mx_pack %[[Q]]#0, %[[Q]]#1
// PTX-LABEL: kernel module moe_fp8block_quantize_300x200_t128x1_e4m3_pow2_f32_kernel
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX: st.global.b8
func.func @quantize(%x: tensor<300x200xf32>) -> (tensor<300x200xf8E4M3FN>, tensor<3x200xf32>) {
  %q = moe.quantize %x : tensor<300x200xf32> -> !moe.fp8block<300x200xf8E4M3FN, block = [128, 1], pow2>
  %d, %s = moe.mx_unpack %q : !moe.fp8block<300x200xf8E4M3FN, block = [128, 1], pow2> -> tensor<300x200xf8E4M3FN>, tensor<3x200xf32>
  return %d, %s : tensor<300x200xf8E4M3FN>, tensor<3x200xf32>
}

// A rank-1 tensor: one row.
// CHECK-LABEL: func.func @rank1
// CHECK: call @moe_fp8block_round_trip_300_t1x128_e4m3_pow2_f32_to_bf16(%arg0)
func.func @rank1(%x: tensor<300xf32>) -> tensor<300xbf16> {
  %q = moe.quantize %x : tensor<300xf32> -> !moe.fp8block<300xf8E4M3FN, block = [128], pow2>
  %y = moe.dequantize %q : !moe.fp8block<300xf8E4M3FN, block = [128], pow2> -> tensor<300xbf16>
  return %y : tensor<300xbf16>
}

// Tiles the kernel does not take stay on the generic kernels; the report
// says why.
// CHECK-LABEL: func.func @other_tiles
// CHECK: moe.quantize
// CHECK: moe.dequantize
// REPORT: remark: moe.dequantize (tensor<256x256xf32>): generic kernels on sm_90a: blockwise FP8: 64 x 64 tiles (the kernel takes 1 x 128, 128 x 1 and 128 x 128)
func.func @other_tiles(%x: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %q = moe.quantize %x : tensor<256x256xf32> -> !moe.fp8block<256x256xf8E4M3FN, block = [64, 64]>
  %y = moe.dequantize %q : !moe.fp8block<256x256xf8E4M3FN, block = [64, 64]> -> tensor<256x256xf32>
  return %y : tensor<256x256xf32>
}

// Packed operands (data and scales from the caller, as bench/gemm.py passes
// them): no quantize, so the dequantizes to bf16 stay on the generic
// kernels, computing every row; nothing reads the offsets on the host.
// CHECK-LABEL: func.func @packed
// CHECK: moe.dequantize
// REPORT: remark: moe.dequantize (tensor<256x256xbf16>): generic kernels on sm_90a: blockwise FP8: the input is not a moe.quantize's result
func.func @packed(%xd: tensor<256x256xf8E4M3FN>, %xs: tensor<256x2xf32>,
                  %wd: tensor<4x256x128xf8E4M3FN>, %ws: tensor<4x2x1xf32>,
                  %off: tensor<5xi32>) -> tensor<256x128xf32> {
  %x = moe.mx_pack %xd, %xs : tensor<256x256xf8E4M3FN>, tensor<256x2xf32>
      -> !moe.fp8block<256x256xf8E4M3FN, block = [1, 128], pow2>
  %w = moe.mx_pack %wd, %ws : tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>
      -> !moe.fp8block<4x256x128xf8E4M3FN, block = [1, 128, 128], pow2>
  %y = moe.grouped_matmul %x, %w, %off
      : !moe.fp8block<256x256xf8E4M3FN, block = [1, 128], pow2>,
        !moe.fp8block<4x256x128xf8E4M3FN, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<256x128xf32>
  return %y : tensor<256x128xf32>
}
