// The memory policy of -moe-gpu-dedicated-kernels (MemoryPolicy.cpp): the
// choices it makes on its estimate of a block's live tensors, each against
// the option that turns it off.
// - pair-round-trips=peak: the two MX round trips of one tensor share a
//   kernel unless holding the second result from the first round trip to
//   its reader raises the block's peak (then each reads the tensor at its
//   reader); =always pairs them anyway.
// - The backward SwiGLU epilogue's columnwise rounding of dh (blocks of 32
//   rows) is used only where the f32 dh it saves would raise the peak.
// - mx-activations=peak: a SwiGLU epilogue writes its activation's MX
//   encoding (8-bit, read 8-bit by the next GEMM) only where the bf16
//   rounding is live at the peak; =always everywhere the readers can take
//   it (hopper-swiglu-epilogue.mlir, @mlp and @train, checks both).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a pair-round-trips=always" \
// RUN:   | FileCheck %s --check-prefix=PAIRS

// Split to hold less: paired, the second blocking would be held through
// the block's widest point (the [4, 64, 96, 8] f32 between the two readers);
// each round trip stays at its reader and reads x again.
// CHECK-LABEL: func.func @split_blockings
// CHECK: call @moe_mx_round_trip_4x64x96_a1_e4m3_rceil_f32_to_bf16(%arg0)
// CHECK: linalg.generic
// CHECK: call @moe_mx_round_trip_4x64x96_a2_e4m3_rceil_f32_to_bf16(%arg0)
// CHECK-NOT: moe_mx_round_trip_pair
// With pair-round-trips=always they share one kernel anyway (x read once).
// PAIRS-LABEL: func.func @split_blockings
// PAIRS: call @moe_mx_round_trip_pair_4x64x96_e4m3_rceil_e4m3_rceil_f32_to_bf16_bf16(%arg0)
// PAIRS: linalg.generic
// PAIRS-NOT: call @moe_mx_round_trip
// PAIRS: return
func.func @split_blockings(%x: tensor<4x64x96xf32>) -> (tensor<4x64x96x8xf32>, tensor<4x64x96xbf16>) {
  %qk = moe.quantize %x : tensor<4x64x96xf32> -> !moe.mx<4x64x96xf8E4M3FN, axis = 1>
  %yk = moe.dequantize %qk : !moe.mx<4x64x96xf8E4M3FN, axis = 1> -> tensor<4x64x96xbf16>
  %e = tensor.empty() : tensor<4x64x96x8xf32>
  %wide = linalg.generic {indexing_maps = [affine_map<(a, b, c, d) -> (a, b, c)>, affine_map<(a, b, c, d) -> (a, b, c, d)>],
                          iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%yk : tensor<4x64x96xbf16>) outs(%e : tensor<4x64x96x8xf32>) {
  ^bb0(%v: bf16, %o: f32):
    %f = arith.extf %v : bf16 to f32
    linalg.yield %f : f32
  } -> tensor<4x64x96x8xf32>
  %qn = moe.quantize %x : tensor<4x64x96xf32> -> !moe.mx<4x64x96xf8E4M3FN, axis = 2>
  %yn = moe.dequantize %qn : !moe.mx<4x64x96xf8E4M3FN, axis = 2> -> tensor<4x64x96xbf16>
  return %wide, %yn : tensor<4x64x96x8xf32>, tensor<4x64x96xbf16>
}

// Aligned groups, but the block's peak is elsewhere (a wide value after the
// GEMMs): the columnwise pass, which slows the epilogue, is not used; dh
// is a result in f32 for its round trip, and nothing is computed twice.
// CHECK-LABEL: func.func @backward_col_peak_elsewhere(
// CHECK: %[[R:.*]]:2 = call @moe_wgmma_gmm_416x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_dh(
// CHECK-NOT: moe.swiglu_grad
// CHECK-NOT: moe.grouped_matmul
// CHECK: call @moe_mx_round_trip_416x512_a0_e5m2_floor_f32_to_bf16{{(_live_i32)?}}(%[[R]]#1
func.func @backward_col_peak_elsewhere(%g: tensor<80x256xbf16>, %idx: tensor<80x4xi32>, %w1: tensor<3x128x512xbf16>,
                                       %w2: tensor<3x256x256xbf16>, %h: tensor<416x512xf32>)
    -> (tensor<416x128x64xf32>, tensor<416x512xbf16>) {
  %dy, %off, %c, %p = moe.dispatch %g, %idx experts(3) pad_to(32)
      : tensor<80x256xbf16>, tensor<80x4xi32> -> tensor<416x256xbf16>, tensor<4xi32>, tensor<3xi32>, tensor<80x4xi32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs
      : tensor<416x256xbf16>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<416x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<416x512xf32>, tensor<416x256xf32> -> tensor<416x512xf32>
  %q = moe.quantize %dh : tensor<416x512xf32> -> !moe.mx<416x512xf8E4M3FN, axis = 1>
  %dx = moe.grouped_matmul %q, %w1, %off transpose_rhs
      : !moe.mx<416x512xf8E4M3FN, axis = 1>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<416x128xf32>
  %q0 = moe.quantize %dh scale(floor) : tensor<416x512xf32> -> !moe.mx<416x512xf8E5M2, axis = 0>
  %r0 = moe.dequantize %q0 : !moe.mx<416x512xf8E5M2, axis = 0> -> tensor<416x512xbf16>
  %e = tensor.empty() : tensor<416x128x64xf32>
  %wide = linalg.generic {indexing_maps = [affine_map<(r, k, j) -> (r, k)>, affine_map<(r, k, j) -> (r, k, j)>],
                          iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%dx : tensor<416x128xf32>) outs(%e : tensor<416x128x64xf32>) {
  ^bb0(%v: f32, %o: f32):
    linalg.yield %v : f32
  } -> tensor<416x128x64xf32>
  return %wide, %r0 : tensor<416x128x64xf32>, tensor<416x512xbf16>
}

