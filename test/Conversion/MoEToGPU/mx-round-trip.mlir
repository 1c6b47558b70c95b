// moe.dequantize of a moe.quantize (the MX rounding of a tensor, as floats)
// becomes one kernel that reads the input once: the IR
// -moe-gpu-dedicated-kernels produces, the PTX of the whole GPU pipeline, and
// ptxas accepting it. test/Integration/GPU/kernels.mlir runs it against the
// CPU on a GPU machine (bit-identical).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s --check-prefixes=BOTH,CHECK
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_100a | FileCheck %s --check-prefix=BOTH
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx
// Chips without dedicated kernels keep the generic path.
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_80 | FileCheck %s --check-prefix=NOKERNEL

// VERIFY: ptxas accepted 19 kernel modules for sm_90a
// NOKERNEL-NOT: moe_mx_round_trip
// NOKERNEL-NOT: gpu.launch

// Blocks along the innermost dim: 8 lanes a block, the amax finished with
// three xor shuffles, 16-byte loads and 8-byte bf16 stores when aligned (4
// scalar accesses otherwise).
// BOTH-LABEL: func.func @rows
// BOTH-NOT: moe.quantize
// BOTH-NOT: moe.dequantize
// BOTH: %[[Y:.*]] = call @moe_mx_round_trip_256x512_a1_e4m3_rceil_f32_to_bf16(%arg0) : (tensor<256x512xf32>) -> tensor<256x512xbf16>
// BOTH: return %[[Y]]
// PTX-LABEL: kernel module moe_mx_round_trip_256x512_a1_e4m3_rceil_f32_to_bf16_kernel
// PTX: ld.global.v4.b32
// PTX-COUNT-3: shfl.sync.bfly.b32
// PTX: st.global.v4.b16
func.func @rows(%x: tensor<256x512xf32>) -> tensor<256x512xbf16> {
  %q = moe.quantize %x : tensor<256x512xf32> -> !moe.mx<256x512xf8E4M3FN, axis = 1>
  %y = moe.dequantize %q : !moe.mx<256x512xf8E4M3FN, axis = 1> -> tensor<256x512xbf16>
  return %y : tensor<256x512xbf16>
}

// Blocks along an outer dim (the weights' K): a thread a block, no shuffles.
// BOTH-LABEL: func.func @cols
// BOTH: call @moe_mx_round_trip_4x64x96_a1_e5m2_floor_bf16_to_f32(%arg0)
// PTX-LABEL: kernel module moe_mx_round_trip_4x64x96_a1_e5m2_floor_bf16_to_f32_kernel
// PTX-NOT: shfl.sync
// PTX-LABEL: kernel module
func.func @cols(%x: tensor<4x64x96xbf16>) -> tensor<4x64x96xf32> {
  %q = moe.quantize %x scale(floor) : tensor<4x64x96xbf16> -> !moe.mx<4x64x96xf8E5M2, axis = 1>
  %y = moe.dequantize %q : !moe.mx<4x64x96xf8E5M2, axis = 1> -> tensor<4x64x96xf32>
  return %y : tensor<4x64x96xf32>
}

// The MX tensor has another use: the quantize stays for it, the round trip
// still reads the input.
// BOTH-LABEL: func.func @shared
// BOTH: %[[Q:.*]] = moe.quantize %arg0
// BOTH: %[[Y:.*]] = call @moe_mx_round_trip_64x64_a0_e4m3_rceil_f32_to_bf16(%arg0)
// BOTH: moe.mx_unpack %[[Q]]
func.func @shared(%x: tensor<64x64xf32>)
    -> (tensor<64x64xbf16>, tensor<64x64xf8E4M3FN>, tensor<2x64xf8E8M0FNU>) {
  %q = moe.quantize %x : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 0>
  %y = moe.dequantize %q : !moe.mx<64x64xf8E4M3FN, axis = 0> -> tensor<64x64xbf16>
  %d, %s = moe.mx_unpack %q : !moe.mx<64x64xf8E4M3FN, axis = 0>
      -> tensor<64x64xf8E4M3FN>, tensor<2x64xf8E8M0FNU>
  return %y, %d, %s : tensor<64x64xbf16>, tensor<64x64xf8E4M3FN>, tensor<2x64xf8E8M0FNU>
}

// Both blockings of one weight (along K for the forward GEMM, along N for
// the data gradient): one kernel reading x once and writing both, placed at
// the first; each round trip keeps its own element type, scale rule and
// result type. A warp takes a 32 x 32 tile: lane l loads column l (a K
// block), then reads row l (an N block) back from the warp's shared-memory
// slab and stores it as one run.
// BOTH-LABEL: func.func @both_blockings
// BOTH-NOT: moe.quantize
// BOTH: %[[R:.*]]:2 = call @moe_mx_round_trip_pair_4x64x96_e4m3_rceil_e5m2_floor_f32_to_bf16_f32(%arg0) : (tensor<4x64x96xf32>) -> (tensor<4x64x96xbf16>, tensor<4x64x96xf32>)
// BOTH-NEXT: return %[[R]]#0, %[[R]]#1
// PTX-LABEL: kernel module moe_mx_round_trip_pair_4x64x96_e4m3_rceil_e5m2_floor_f32_to_bf16_f32_kernel
// PTX-COUNT-32: ld.global.b32
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX: bar.warp.sync -1;
// PTX-COUNT-32: ld.shared.b32
// PTX: bar.warp.sync -1;
// PTX: cvt.rn.satfinite.e5m2x2.f32
// PTX: st.global.v4.b32
func.func @both_blockings(%x: tensor<4x64x96xf32>) -> (tensor<4x64x96xbf16>, tensor<4x64x96xf32>) {
  %qk = moe.quantize %x : tensor<4x64x96xf32> -> !moe.mx<4x64x96xf8E4M3FN, axis = 1>
  %yk = moe.dequantize %qk : !moe.mx<4x64x96xf8E4M3FN, axis = 1> -> tensor<4x64x96xbf16>
  %qn = moe.quantize %x scale(floor) : tensor<4x64x96xf32> -> !moe.mx<4x64x96xf8E5M2, axis = 2>
  %yn = moe.dequantize %qn : !moe.mx<4x64x96xf8E5M2, axis = 2> -> tensor<4x64x96xf32>
  return %yk, %yn : tensor<4x64x96xbf16>, tensor<4x64x96xf32>
}

// A dequantize of another MX tensor is no round trip (it takes the
// dequantize kernel, mx-dequantize.mlir).
// BOTH-LABEL: func.func @not_handled
// BOTH-NOT: call @moe_mx_round_trip
// BOTH: call @moe_mx_dequantize_64x64_a1_e4m3_to_f32(
// BOTH-NOT: call @moe_mx_round_trip
func.func @not_handled(%d: tensor<64x64xf8E4M3FN>, %s: tensor<64x2xf8E8M0FNU>) -> tensor<64x64xf32> {
  %q = moe.mx_pack %d, %s : tensor<64x64xf8E4M3FN>, tensor<64x2xf8E8M0FNU>
      -> !moe.mx<64x64xf8E4M3FN, axis = 1>
  %y = moe.dequantize %q : !moe.mx<64x64xf8E4M3FN, axis = 1> -> tensor<64x64xf32>
  return %y : tensor<64x64xf32>
}

// A dispatch's rows, of which nothing reads those past offsets[E] (the GEMM's rows
// are combined back through the dispatch's positions): the `_live` variant
// computes the rows before offsets[E] only. The same GEMM twice (a forward
// and its recomputation), one of whose results needs every row: both calls
// get the kernel that writes every row, so CSE can merge them.
// Blackwell's GEMM takes the MX operands as they are (no round trip).
// CHECK-LABEL: func.func @live_rows
// CHECK: %[[S:.*]], %[[O:.*]], %{{.*}}, %{{.*}} = moe.dispatch
// CHECK: %[[A:.*]] = call @moe_mx_round_trip_128x128_a1_e4m3_rceil_f32_to_bf16_live_i32(%[[S]], %[[O]])
// CHECK: %[[Y1:.*]] = call @moe_wgmma_gmm_128x128x128_e4_bf16_i32(%[[A]],
// CHECK: %[[Y2:.*]] = call @moe_wgmma_gmm_128x128x128_e4_bf16_i32(
// The kernel functions follow the callers, the pair kernel (created first)
// first: 4 x 2 x 3 = 24 tiles, 8 warps a CTA: 3 CTAs.
// BOTH-LABEL: func.func private @moe_mx_round_trip_pair_4x64x96_e4m3_rceil_e5m2_floor_f32_to_bf16_f32(
// BOTH-SAME: moe.dedicated_kernel = "mx round trips along both dims"
// BOTH: gpu.launch blocks({{.*}}) in ({{.*}} = %c3, {{.*}}) threads({{.*}}) in ({{.*}} = %c256, {{.*}}) dynamic_shared_memory_size %c33792_i32
// CHECK: func.func private @moe_mx_round_trip_128x128_a1_e4m3_rceil_f32_to_bf16_live_i32(%{{[a-z0-9]+}}: tensor<128x128xf32> {moe.group_rows}, %{{[a-z0-9]+}}: tensor<5xi32> {moe.group_offsets})
// PTX-LABEL: kernel module moe_mx_round_trip_128x128_a1_e4m3_rceil_f32_to_bf16_live_i32_kernel
// PTX: ld.global.b32 {{.*}}+16]
func.func @live_rows(%x: tensor<64x128xf32>, %idx: tensor<64x2xi32>,
                     %cw: tensor<64x2xf32>, %w: tensor<4x128x128xf32>)
    -> (tensor<64x128xf32>, tensor<128x128xf32>) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<64x128xf32>, tensor<64x2xi32> -> tensor<128x128xf32>, tensor<5xi32>, tensor<4xi32>, tensor<64x2xi32>
  %sq = moe.quantize %s : tensor<128x128xf32> -> !moe.mx<128x128xf8E4M3FN, axis = 1>
  %wq = moe.quantize %w : tensor<4x128x128xf32> -> !moe.mx<4x128x128xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %sq, %wq, %o
      : !moe.mx<128x128xf8E4M3FN, axis = 1>, !moe.mx<4x128x128xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x128xf32>
  %out = moe.combine %y, %cw, %p : tensor<128x128xf32>, tensor<64x2xf32>, tensor<64x2xi32> -> tensor<64x128xf32>
  %y2 = moe.grouped_matmul %sq, %wq, %o
      : !moe.mx<128x128xf8E4M3FN, axis = 1>, !moe.mx<4x128x128xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x128xf32>
  return %out, %y2 : tensor<64x128xf32>, tensor<128x128xf32>
}
