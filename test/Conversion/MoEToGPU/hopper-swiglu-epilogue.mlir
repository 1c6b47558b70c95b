// The fused expert MLP on Hopper: the first GEMM's TMA kernel computes
// SwiGLU and the MX quantization of the activation in its epilogue. When
// only TMA GEMMs read the quantization (as their lhs) and the rounding is
// live at the peak of live tensors (or with mx-activations=always), it
// returns the MX elements and scales, which those kernels read 8-bit and
// dequantize in shared memory; otherwise the second GEMM's exact bf16
// operand (the MX rounding as bf16). h [R, 2F] and the f32 activation
// are written only when something else reads them (a train step's
// backward), as further results. Nothing of it runs here
// (test/Integration/GPU/kernels.mlir runs it on the GPU).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels=chip=sm_90a | FileCheck %s
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a mx-activations=always" \
// RUN:   | FileCheck %s --check-prefix=ALWAYS
// RUN: not moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a mx-activations=never" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=BADOPT
// BADOPT: for the --mx-activations option: Cannot find option named 'never'!
// RUN: moe-compile %s --target=sm_90a --emit-ptx=%t.ptx --verify-ptx -o %t.so \
// RUN:   | FileCheck %s --check-prefix=VERIFY
// RUN: FileCheck %s --check-prefix=PTX < %t.ptx

// VERIFY: ptxas accepted 49 kernel modules for sm_90a

// Forward: h and the f32 activation are never materialized; the activation
// only as its MX encoding, which the second GEMM reads (the rounding would
// be live at the function's peak, with the second GEMM's result).
// CHECK-LABEL: func.func @mlp(
// CHECK-SAME: %[[X:[^:]*]]: tensor<300x128xbf16>, %[[W1:[^:]*]]: tensor<3x128x512xbf16>, %[[W2:[^:]*]]: tensor<3x256x256xbf16>, %[[OFF:[^:]*]]: tensor<4xi32>
// CHECK-NEXT: %[[A:.*]]:2 = call @moe_wgmma_gmm_300x128x512_e3_bf16_i32_live_tma_swiglu_e4m3_rceil_mx(%[[X]], %[[W1]], %[[OFF]]) : (tensor<300x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32>) -> (tensor<300x256xf8E4M3FN>, tensor<300x8xf8E8M0FNU>)
// CHECK-NEXT: %[[Y:.*]] = call @moe_wgmma_gmm_300x256x256_e3_bf16_i32_tma_e4m3_lhs(%[[A]]#0, %[[A]]#1, %[[W2]], %[[OFF]]) : (tensor<300x256xf8E4M3FN>, tensor<300x8xf8E8M0FNU>, tensor<3x256x256xbf16>, tensor<4xi32>) -> tensor<300x256xf32>
// CHECK-NEXT: return %[[Y]]
func.func @mlp(%x: tensor<300x128xbf16>, %w1: tensor<3x128x512xbf16>,
               %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>) -> tensor<300x256xf32> {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<300x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<300x512xf32>
  %a = moe.swiglu %h : tensor<300x512xf32> -> tensor<300x256xf32>
  %q = moe.quantize %a : tensor<300x256xf32> -> !moe.mx<300x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off
      : !moe.mx<300x256xf8E4M3FN, axis = 1>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<300x256xf32>
  return %y : tensor<300x256xf32>
}

// The rounding read by something besides GEMMs (here a result): the
// epilogue returns it as bf16, which the second GEMM reads too.
// CHECK-LABEL: func.func @mlp_rounding_returned(
// CHECK-NEXT: %[[A:.*]] = call @moe_wgmma_gmm_300x128x512_e3_bf16_i32_tma_swiglu_e4m3_rceil(%{{.*}}) : ({{.*}}) -> tensor<300x256xbf16>
// CHECK-NEXT: %[[Y:.*]] = call @moe_wgmma_gmm_300x256x256_e3_bf16_i32_tma(%[[A]],
// CHECK-NEXT: return %[[Y]], %[[A]]
func.func @mlp_rounding_returned(%x: tensor<300x128xbf16>, %w1: tensor<3x128x512xbf16>,
                                 %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>)
    -> (tensor<300x256xf32>, tensor<300x256xbf16>) {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<300x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<300x512xf32>
  %a = moe.swiglu %h : tensor<300x512xf32> -> tensor<300x256xf32>
  %q = moe.quantize %a : tensor<300x256xf32> -> !moe.mx<300x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off
      : !moe.mx<300x256xf8E4M3FN, axis = 1>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<300x256xf32>
  %r = moe.dequantize %q : !moe.mx<300x256xf8E4M3FN, axis = 1> -> tensor<300x256xbf16>
  return %y, %r : tensor<300x256xf32>, tensor<300x256xbf16>
}

// A train step: the backward reads h (swiglu_grad) and the activation
// (quantized along the rows for the weight gradient), so the kernel returns
// them too. E5M2 elements and the floor scale rule come from the quantize.
// The peak is later (at the gradient, with h), so the rounding stays bf16;
// with mx-activations=always the encoding.
// CHECK-LABEL: func.func @train(
// CHECK-NEXT: %[[R:.*]]:3 = call @moe_wgmma_gmm_320x128x512_e3_bf16_i32_tma_swiglu_e5m2_floor_h_a(%{{.*}}) : ({{.*}}) -> (tensor<320x256xbf16>, tensor<320x512xf32>, tensor<320x256xf32>)
// CHECK-NEXT: call @moe_wgmma_gmm_320x256x256_e3_bf16_i32_tma(%[[R]]#0,
// CHECK-NEXT: moe.swiglu_grad %[[R]]#1,
// CHECK-NEXT: call @moe_mx_round_trip_320x256_a0_e5m2_floor_f32_to_f32(%[[R]]#2)
// ALWAYS-LABEL: func.func @train(
// ALWAYS-NEXT: %[[R:.*]]:4 = call @moe_wgmma_gmm_320x128x512_e3_bf16_i32_tma_swiglu_e5m2_floor_mx_h_a(%{{.*}}) : ({{.*}}) -> (tensor<320x256xf8E5M2>, tensor<320x8xf8E8M0FNU>, tensor<320x512xf32>, tensor<320x256xf32>)
// ALWAYS-NEXT: call @moe_wgmma_gmm_320x256x256_e3_bf16_i32_tma_e5m2_lhs(%[[R]]#0, %[[R]]#1,
// ALWAYS-NEXT: moe.swiglu_grad %[[R]]#2,
// ALWAYS-NEXT: call @moe_mx_round_trip_320x256_a0_e5m2_floor_f32_to_f32(%[[R]]#3)
func.func @train(%x: tensor<320x128xbf16>, %w1: tensor<3x128x512xbf16>,
                 %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>, %da: tensor<320x256xf32>)
    -> (tensor<320x256xf32>, tensor<320x512xf32>, tensor<320x256xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<320x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<320x512xf32>
  %a = moe.swiglu %h : tensor<320x512xf32> -> tensor<320x256xf32>
  %q = moe.quantize %a scale(floor) : tensor<320x256xf32> -> !moe.mx<320x256xf8E5M2, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off
      : !moe.mx<320x256xf8E5M2, axis = 1>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<320x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<320x512xf32>, tensor<320x256xf32> -> tensor<320x512xf32>
  %qa = moe.quantize %a scale(floor) : tensor<320x256xf32> -> !moe.mx<320x256xf8E5M2, axis = 0>
  %ra = moe.dequantize %qa : !moe.mx<320x256xf8E5M2, axis = 0> -> tensor<320x256xf32>
  return %y, %dh, %ra : tensor<320x256xf32>, tensor<320x512xf32>, tensor<320x256xf32>
}

// Groups padded to 32 rows: the forward epilogue also rounds the activation
// columnwise (blocks of 32 rows, the second GEMM's weight-gradient operand),
// so the f32 activation is not written.
// CHECK-LABEL: func.func @train_col(
// CHECK: %[[S:.*]], %[[OFF:.*]], %{{.*}}, %{{.*}} = moe.dispatch
// CHECK-NEXT: %[[R:.*]]:3 = call @moe_wgmma_gmm_416x128x512_e3_bf16_i32_tma_swiglu_e4m3_rceil_h_col_e5m2_floor(%[[S]], %{{.*}}, %[[OFF]]) : ({{.*}}) -> (tensor<416x256xbf16>, tensor<416x512xf32>, tensor<416x256xbf16>)
// CHECK-NEXT: call @moe_wgmma_gmm_416x256x256_e3_bf16_i32_tma(%[[R]]#0,
// CHECK-NEXT: moe.swiglu_grad %[[R]]#1,
// CHECK-NEXT: return {{.*}}, %[[R]]#2
func.func @train_col(%g: tensor<80x128xbf16>, %idx: tensor<80x4xi32>, %w1: tensor<3x128x512xbf16>,
                     %w2: tensor<3x256x256xbf16>, %da: tensor<416x256xf32>)
    -> (tensor<416x256xf32>, tensor<416x512xf32>, tensor<416x256xbf16>) {
  %x, %off, %c, %p = moe.dispatch %g, %idx experts(3) pad_to(32)
      : tensor<80x128xbf16>, tensor<80x4xi32> -> tensor<416x128xbf16>, tensor<4xi32>, tensor<3xi32>, tensor<80x4xi32>
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<416x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<416x512xf32>
  %a = moe.swiglu %h : tensor<416x512xf32> -> tensor<416x256xf32>
  %q = moe.quantize %a : tensor<416x256xf32> -> !moe.mx<416x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off
      : !moe.mx<416x256xf8E4M3FN, axis = 1>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<416x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<416x512xf32>, tensor<416x256xf32> -> tensor<416x512xf32>
  %qa = moe.quantize %a scale(floor) : tensor<416x256xf32> -> !moe.mx<416x256xf8E5M2, axis = 0>
  %ra = moe.dequantize %qa : !moe.mx<416x256xf8E5M2, axis = 0> -> tensor<416x256xbf16>
  return %y, %dh, %ra : tensor<416x256xf32>, tensor<416x512xf32>, tensor<416x256xbf16>
}

// Backward: the data gradient da = dy @ w2^T computes dh = swiglu_grad(h, da)
// and its MX rounding (the next data gradient's operand) in its epilogue,
// reading h; da is never materialized. dh itself is a result only when
// something else reads it (here the weight gradient's quantization along
// the rows).
// CHECK-LABEL: func.func @backward(
// CHECK-SAME: %[[DY:[^:]*]]: tensor<320x256xbf16>, %[[W1:[^:]*]]: tensor<3x128x512xbf16>, %[[W2:[^:]*]]: tensor<3x256x256xbf16>, %[[OFF:[^:]*]]: tensor<4xi32>, %[[H:[^:]*]]: tensor<320x512xf32>
// CHECK-NEXT: %[[R:.*]]:2 = call @moe_wgmma_gmm_320x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_dh(%[[DY]], %[[W2]], %[[OFF]], %[[H]]) : ({{.*}}) -> (tensor<320x512xbf16>, tensor<320x512xf32>)
// CHECK-NEXT: call @moe_wgmma_gmm_320x512x128_e3_bf16_rhsT_i32(%[[R]]#0, %[[W1]], %[[OFF]])
// CHECK-NEXT: call @moe_mx_round_trip_320x512_a0_e4m3_rceil_f32_to_f32(%[[R]]#1)
func.func @backward(%dy: tensor<320x256xbf16>, %w1: tensor<3x128x512xbf16>,
                    %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>, %h: tensor<320x512xf32>)
    -> (tensor<320x128xf32>, tensor<320x512xf32>) {
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs
      : tensor<320x256xbf16>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<320x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<320x512xf32>, tensor<320x256xf32> -> tensor<320x512xf32>
  %q = moe.quantize %dh : tensor<320x512xf32> -> !moe.mx<320x512xf8E4M3FN, axis = 1>
  %dx = moe.grouped_matmul %q, %w1, %off transpose_rhs
      : !moe.mx<320x512xf8E4M3FN, axis = 1>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<320x128xf32>
  %q0 = moe.quantize %dh : tensor<320x512xf32> -> !moe.mx<320x512xf8E4M3FN, axis = 0>
  %r0 = moe.dequantize %q0 : !moe.mx<320x512xf8E4M3FN, axis = 0> -> tensor<320x512xf32>
  return %dx, %r0 : tensor<320x128xf32>, tensor<320x512xf32>
}

// With a TMA data gradient after it (N = 256), the backward epilogue too
// returns dh's MX encoding, which that GEMM reads 8-bit (the rounding is
// live at the peak, with dh in f32 and that GEMM's result).
// CHECK-LABEL: func.func @backward_mx(
// CHECK-NEXT: %[[R:.*]]:3 = call @moe_wgmma_gmm_320x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_mx_dh(%{{.*}}) : ({{.*}}) -> (tensor<320x512xf8E4M3FN>, tensor<320x16xf8E8M0FNU>, tensor<320x512xf32>)
// CHECK-NEXT: call @moe_wgmma_gmm_320x512x256_e3_bf16_rhsT_i32_tma_e4m3_lhs(%[[R]]#0, %[[R]]#1,
// CHECK-NEXT: call @moe_mx_round_trip_320x512_a0_e4m3_rceil_f32_to_f32(%[[R]]#2)
func.func @backward_mx(%dy: tensor<320x256xbf16>, %w1: tensor<3x256x512xbf16>,
                       %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>, %h: tensor<320x512xf32>)
    -> (tensor<320x256xf32>, tensor<320x512xf32>) {
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs
      : tensor<320x256xbf16>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<320x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<320x512xf32>, tensor<320x256xf32> -> tensor<320x512xf32>
  %q = moe.quantize %dh : tensor<320x512xf32> -> !moe.mx<320x512xf8E4M3FN, axis = 1>
  %dx = moe.grouped_matmul %q, %w1, %off transpose_rhs
      : !moe.mx<320x512xf8E4M3FN, axis = 1>, tensor<3x256x512xbf16>, tensor<4xi32> -> tensor<320x256xf32>
  %q0 = moe.quantize %dh : tensor<320x512xf32> -> !moe.mx<320x512xf8E4M3FN, axis = 0>
  %r0 = moe.dequantize %q0 : !moe.mx<320x512xf8E4M3FN, axis = 0> -> tensor<320x512xf32>
  return %dx, %r0 : tensor<320x256xf32>, tensor<320x512xf32>
}

// Groups padded to 32 rows (the dispatch's pad_to): with
// mx-activations=always, dh's columnwise MX rounding (blocks of 32 rows,
// the weight gradient's operand) comes out of the same epilogue, and dh in
// f32 is not written; by default (that pass more than doubles the epilogue's time)
// dh is written and rounded columnwise by its own kernel.
// ALWAYS-LABEL: func.func @backward_col(
// ALWAYS: %[[S:.*]], %[[OFF:.*]], %{{.*}}, %{{.*}} = moe.dispatch
// ALWAYS-NEXT: %[[R:.*]]:2 = call @moe_wgmma_gmm_416x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_col_e5m2_floor(%[[S]], %{{.*}}, %[[OFF]], %{{.*}}) : ({{.*}}) -> (tensor<416x512xbf16>, tensor<416x512xbf16>)
// ALWAYS-NEXT: %[[DX:.*]] = call @moe_wgmma_gmm_416x512x128_e3_bf16_rhsT_i32(%[[R]]#0,
// ALWAYS-NEXT: return %[[DX]], %[[R]]#1
// CHECK-LABEL: func.func @backward_col(
// CHECK: call @moe_wgmma_gmm_416x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_dh(
// CHECK: call @moe_mx_round_trip_416x512_a0_e5m2_floor_f32_to_bf16(
// Without the padding the columnwise rounding stays its own kernel.
// CHECK-LABEL: func.func @backward_col_unaligned(
// CHECK: call @moe_wgmma_gmm_416x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_dh(
// CHECK: call @moe_mx_round_trip_416x512_a0_e5m2_floor_f32_to_bf16(
func.func @backward_col(%g: tensor<80x256xbf16>, %idx: tensor<80x4xi32>, %w1: tensor<3x128x512xbf16>,
                        %w2: tensor<3x256x256xbf16>, %h: tensor<416x512xf32>)
    -> (tensor<416x128xf32>, tensor<416x512xbf16>) {
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
  return %dx, %r0 : tensor<416x128xf32>, tensor<416x512xbf16>
}
func.func @backward_col_unaligned(%g: tensor<80x256xbf16>, %idx: tensor<80x4xi32>, %w1: tensor<3x128x512xbf16>,
                                  %w2: tensor<3x256x256xbf16>, %h: tensor<416x512xf32>)
    -> (tensor<416x128xf32>, tensor<416x512xbf16>) {
  %dy, %off, %c, %p = moe.dispatch %g, %idx experts(3) pad_to(16)
      : tensor<80x256xbf16>, tensor<80x4xi32> -> tensor<416x256xbf16>, tensor<4xi32>, tensor<3xi32>, tensor<80x4xi32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs
      : tensor<416x256xbf16>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<416x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<416x512xf32>, tensor<416x256xf32> -> tensor<416x512xf32>
  %q = moe.quantize %dh : tensor<416x512xf32> -> !moe.mx<416x512xf8E4M3FN, axis = 1>
  %dx = moe.grouped_matmul %q, %w1, %off transpose_rhs
      : !moe.mx<416x512xf8E4M3FN, axis = 1>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<416x128xf32>
  %q0 = moe.quantize %dh scale(floor) : tensor<416x512xf32> -> !moe.mx<416x512xf8E5M2, axis = 0>
  %r0 = moe.dequantize %q0 : !moe.mx<416x512xf8E5M2, axis = 0> -> tensor<416x512xbf16>
  return %dx, %r0 : tensor<416x128xf32>, tensor<416x512xbf16>
}

// Not fused: da read by something else too.
// CHECK-LABEL: func.func @backward_da_used(
// CHECK: call @moe_wgmma_gmm_320x256x256_e3_bf16_rhsT_i32_tma(
// CHECK: moe.swiglu_grad
func.func @backward_da_used(%dy: tensor<320x256xbf16>, %w1: tensor<3x128x512xbf16>,
                            %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>, %h: tensor<320x512xf32>)
    -> (tensor<320x128xf32>, tensor<320x256xf32>) {
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs
      : tensor<320x256xbf16>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<320x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<320x512xf32>, tensor<320x256xf32> -> tensor<320x512xf32>
  %q = moe.quantize %dh : tensor<320x512xf32> -> !moe.mx<320x512xf8E4M3FN, axis = 1>
  %dx = moe.grouped_matmul %q, %w1, %off transpose_rhs
      : !moe.mx<320x512xf8E4M3FN, axis = 1>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<320x128xf32>
  return %dx, %da : tensor<320x128xf32>, tensor<320x256xf32>
}

// Not fused: the interleaved layout (gate and up alternate). Fused: a GEMM
// whose 2F = 384 is no multiple of 256 (its last tile holds 64 outputs; the
// blocks past F store nothing).
// CHECK-LABEL: func.func @interleaved(
// CHECK: call @moe_wgmma_gmm_300x128x512_e3_bf16_i32_live_tma(
// CHECK: moe.swiglu {{.*}} layout(interleaved)
// CHECK: call @moe_mx_round_trip_300x256_a1_e4m3_rceil_f32_to_bf16
func.func @interleaved(%x: tensor<300x128xbf16>, %w1: tensor<3x128x512xbf16>,
                       %w2: tensor<3x256x256xbf16>, %off: tensor<4xi32>) -> tensor<300x256xf32> {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<300x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<300x512xf32>
  %a = moe.swiglu %h layout(interleaved) : tensor<300x512xf32> -> tensor<300x256xf32>
  %q = moe.quantize %a : tensor<300x256xf32> -> !moe.mx<300x256xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off
      : !moe.mx<300x256xf8E4M3FN, axis = 1>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<300x256xf32>
  return %y : tensor<300x256xf32>
}
// CHECK-LABEL: func.func @narrow(
// CHECK: call @moe_wgmma_gmm_300x128x384_e3_bf16_i32_live_tma_swiglu_e4m3_rceil_mx(
// CHECK-NOT: moe.swiglu
// CHECK: call @moe_wgmma_gmm_300x192x256_e3_bf16_i32_tma_e4m3_lhs(
func.func @narrow(%x: tensor<300x128xbf16>, %w1: tensor<3x128x384xbf16>,
                  %w2: tensor<3x192x256xbf16>, %off: tensor<4xi32>) -> tensor<300x256xf32> {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<300x128xbf16>, tensor<3x128x384xbf16>, tensor<4xi32> -> tensor<300x384xf32>
  %a = moe.swiglu %h : tensor<300x384xf32> -> tensor<300x192xf32>
  %q = moe.quantize %a : tensor<300x192xf32> -> !moe.mx<300x192xf8E4M3FN, axis = 1>
  %y = moe.grouped_matmul %q, %w2, %off
      : !moe.mx<300x192xf8E4M3FN, axis = 1>, tensor<3x192x256xbf16>, tensor<4xi32> -> tensor<300x256xf32>
  return %y : tensor<300x256xf32>
}

// The bf16 recipe: the activation only rounded to bf16, as the swiglu's
// result type (a step's forward and its backward's recomputation, one op
// after CSE: the kernel also returns h for the gradient), and dh only
// rounded by truncf ops: the epilogues store those roundings.
// CHECK-LABEL: func.func @bf16_train(
// CHECK-NEXT: %[[A:.*]]:2 = call @moe_wgmma_gmm_320x128x512_e3_bf16_i32_tma_swiglu_bf16_h(%{{.*}}) : ({{.*}}) -> (tensor<320x256xbf16>, tensor<320x512xf32>)
// CHECK-NOT: moe.swiglu
// CHECK-NOT: linalg.generic
// CHECK: %[[Y:.*]] = call @moe_wgmma_gmm_320x256x256_e3_bf16_i32_tma(%[[A]]#0,
// CHECK: %[[DH:.*]] = call @moe_wgmma_gmm_320x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_bf16(%{{.*}}, %{{.*}}, %{{.*}}, %[[A]]#1) : ({{.*}}) -> tensor<320x512xbf16>
// CHECK-NOT: linalg.generic
// CHECK: %[[DW2:.*]] = call @moe_wgmma_wgrad_320x256x256_e3_bf16_i32_tma(%[[A]]#0,
// CHECK: return %[[Y]], %[[DH]], %[[DW2]]
func.func @bf16_train(%x: tensor<320x128xbf16>, %w1: tensor<3x128x512xbf16>,
                      %w2: tensor<3x256x256xbf16>, %dy: tensor<320x256xbf16>,
                      %off: tensor<4xi32>)
    -> (tensor<320x256xf32>, tensor<320x512xbf16>, tensor<3x256x256xf32>) {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<320x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<320x512xf32>
  %a = moe.swiglu %h : tensor<320x512xf32> -> tensor<320x256xbf16>
  %y = moe.grouped_matmul %a, %w2, %off
      : tensor<320x256xbf16>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<320x256xf32>
  %da = moe.grouped_matmul %dy, %w2, %off transpose_rhs
      : tensor<320x256xbf16>, tensor<3x256x256xbf16>, tensor<4xi32> -> tensor<320x256xf32>
  %dh = moe.swiglu_grad %h, %da : tensor<320x512xf32>, tensor<320x256xf32> -> tensor<320x512xf32>
  %e2 = tensor.empty() : tensor<320x512xbf16>
  %dhr = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                         iterator_types = ["parallel", "parallel"]}
      ins(%dh : tensor<320x512xf32>) outs(%e2 : tensor<320x512xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<320x512xbf16>
  %dw2 = moe.grouped_matmul_wgrad %a, %dy, %off
      : tensor<320x256xbf16>, tensor<320x256xbf16>, tensor<4xi32> -> tensor<3x256x256xf32>
  return %y, %dhr, %dw2 : tensor<320x256xf32>, tensor<320x512xbf16>, tensor<3x256x256xf32>
}
// The forward's activation in f32, read only by its bf16 rounding (truncf):
// the kernel's bf16 result replaces the rounding.
// CHECK-LABEL: func.func @bf16_rounded(
// CHECK-NEXT: %[[A:.*]] = call @moe_wgmma_gmm_320x128x512_e3_bf16_i32_tma_swiglu_bf16(%{{.*}}) : ({{.*}}) -> tensor<320x256xbf16>
// CHECK-NOT: linalg.generic
// CHECK: return %[[A]]
func.func @bf16_rounded(%x: tensor<320x128xbf16>, %w1: tensor<3x128x512xbf16>,
                        %off: tensor<4xi32>) -> tensor<320x256xbf16> {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<320x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<320x512xf32>
  %a = moe.swiglu %h : tensor<320x512xf32> -> tensor<320x256xf32>
  %e = tensor.empty() : tensor<320x256xbf16>
  %ar = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                        iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<320x256xf32>) outs(%e : tensor<320x256xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<320x256xbf16>
  return %ar : tensor<320x256xbf16>
}
// Not fused: an activation also read in f32, and a width (F = 48) that is
// no multiple of 32 (which the kernel report names).
// RUN: moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_90a report=true" -o /dev/null 2>&1 \
// RUN:   | FileCheck %s --check-prefix=REPORT
// REPORT: hopper-swiglu-epilogue.mlir:[[@LINE+12]]:{{[0-9]+}}: remark: moe.grouped_matmul (tensor<320x96xf32>): its SwiGLU (and the rounding after it) on the generic kernels, not in this GEMM's epilogue: the SwiGLU's width 48 is not a multiple of 32
// CHECK-LABEL: func.func @bf16_unfused(
// CHECK: call @moe_wgmma_gmm_320x128x512_e3_bf16_i32_tma(
// CHECK: moe.swiglu
// CHECK: call @moe_wgmma_gmm_320x128x96_e3_bf16_i32
// CHECK: moe.swiglu
func.func @bf16_unfused(%x: tensor<320x128xbf16>, %w1: tensor<3x128x512xbf16>,
                        %w3: tensor<3x128x96xbf16>, %off: tensor<4xi32>)
    -> (tensor<320x256xf32>, tensor<320x48xbf16>) {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<320x128xbf16>, tensor<3x128x512xbf16>, tensor<4xi32> -> tensor<320x512xf32>
  %a = moe.swiglu %h : tensor<320x512xf32> -> tensor<320x256xf32>
  %h3 = moe.grouped_matmul %x, %w3, %off
      : tensor<320x128xbf16>, tensor<3x128x96xbf16>, tensor<4xi32> -> tensor<320x96xf32>
  %a3 = moe.swiglu %h3 : tensor<320x96xf32> -> tensor<320x48xbf16>
  return %a, %a3 : tensor<320x256xf32>, tensor<320x48xbf16>
}

// The kernel: the same launch as the plain TMA kernel; the B tile's four
// boxes are the 128 gate and then the 128 up columns of the tile's outputs.
// CHECK-LABEL: func.func private @moe_wgmma_gmm_300x128x512_e3_bf16_i32_live_tma_swiglu_e4m3_rceil_mx(
// CHECK-SAME: -> (tensor<300x256xf8E4M3FN>, tensor<300x8xf8E8M0FNU>)
// CHECK-SAME: moe.dedicated_kernel = "cp.async.bulk.tensor + wgmma.mma_async bf16, SwiGLU and MX rounding epilogue"
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c12,
// CHECK: nvvm.setmaxregister decrease 40
// CHECK: nvvm.setmaxregister increase 232
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 256, k = 16>

// The second GEMM reading the MX encoding: the producer's copies of the
// 8-bit elements (64-byte boxes) land on their own barrier; the producer
// warpgroup keeps 120 registers for its three converter warps.
// CHECK-LABEL: func.func private @moe_wgmma_gmm_300x256x256_e3_bf16_i32_tma_e4m3_lhs(
// CHECK-SAME: %{{.*}}: tensor<300x256xf8E4M3FN> {moe.group_rows}, %{{.*}}: tensor<300x8xf8E8M0FNU> {moe.group_rows}, %{{.*}}: tensor<3x256x256xbf16>, %{{.*}}: tensor<4xi32> {moe.group_offsets}
// CHECK-SAME: moe.dedicated_kernel = "cp.async.bulk.tensor + wgmma.mma_async bf16, MX lhs dequantized in shared memory"
// CHECK: arith.constant 1 : i64
// CHECK-NEXT: arith.constant 256 : i64
// CHECK-NEXT: arith.constant 300 : i64
// CHECK-NEXT: arith.constant 256 : i64
// CHECK-NEXT: arith.constant 64 : i64
// CHECK-NEXT: arith.constant 128 : i64
// CHECK-NEXT: call @moertTensorMap2D(
// CHECK: nvvm.setmaxregister decrease 120
// CHECK: nvvm.setmaxregister increase 184

// h, a result here, is stored directly (the copy engine's staging boxes are
// for the plain GEMMs' results).
// CHECK-LABEL: func.func private @moe_wgmma_gmm_320x128x512_e3_bf16_i32_tma_swiglu_e5m2_floor_h_a(
// CHECK-NOT: nvvm.cp.async.bulk.tensor.global.shared.cta
// CHECK: llvm.store {{.*}} : vector<2xf32>, !llvm.ptr<1>
// CHECK-NOT: nvvm.cp.async.bulk.tensor.global.shared.cta
// CHECK: return

// In the PTX, registers move from the producer to the consumers; per MX block an
// amax over the 4 lanes of a row (xor shuffles 1 and 2), the scale, the
// hardware's f32 -> e4m3 rounding, the element pairs and the scale byte
// stored.
// PTX-LABEL: .entry moe_wgmma_gmm_300x128x512_e3_bf16_i32_live_tma_swiglu_e4m3_rceil_mx_kernel(
// PTX: setmaxnreg.inc.sync.aligned.u32 232;
// PTX: ex2.approx
// PTX: shfl.sync.bfly.b32 {{.*}}, 1, 31, -1;
// PTX: shfl.sync.bfly.b32 {{.*}}, 2, 31, -1;
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX: st.global.b16
// PTX: st.global.b8
// PTX: setmaxnreg.dec.sync.aligned.u32 40;

// The converters (after the consumers' code, with the registers the
// producer warpgroup keeps): each thread's fence of its bf16 writes and
// arrival on the stage's full barrier (the loop rotated to its top), scale
// bytes from global memory, the elements' 16-byte loads from shared memory
// once they landed, the converters' named barrier, the exact decode and
// 16-byte bf16 stores; then the producer's expect-tx and copies.
// PTX-LABEL: .entry moe_wgmma_gmm_300x256x256_e3_bf16_i32_tma_e4m3_lhs_kernel(
// PTX: setmaxnreg.inc.sync.aligned.u32 184;
// PTX: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// PTX: setmaxnreg.dec.sync.aligned.u32 120;
// PTX: fence.proxy.async.shared::cta;
// PTX-NEXT: mbarrier.arrive.shared.b64
// PTX: ld.global.b8
// PTX: mbarrier.try_wait.parity
// PTX: ld.shared.v4.b32
// PTX: bar.sync 8, 96;
// PTX: cvt.rn.f16x2.e4m3x2
// PTX: st.shared.v4.b32
// PTX: mbarrier.arrive.expect_tx
// PTX: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes

// The backward kernel: 8-byte loads of h's gate and up, two blocks (gate
// and up halves of dh) per 8 values of da.
// PTX-LABEL: .entry moe_wgmma_gmm_320x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_dh_kernel(
// PTX: setmaxnreg.inc.sync.aligned.u32 232;
// PTX: ld.global.v2.b32
// PTX: ld.global.v2.b32
// PTX: ex2.approx
// PTX: shfl.sync.bfly.b32 {{.*}}, 1, 31, -1;
// PTX: cvt.rn.satfinite.e4m3x2.f32

// With the columnwise rounding (mx-activations=always): each warp's column
// amaxes over its 16 rows (xor shuffles 4, 8, 16), handed to the other warp
// of its 32-row pair through shared memory at a 64-thread named barrier.
// RUN: moe-compile %s --target=sm_90a --mx-activations=always --emit-ptx=%t.always.ptx -o %t.always.so
// RUN: FileCheck %s --check-prefix=PTXALWAYS < %t.always.ptx
// PTXALWAYS-LABEL: .entry moe_wgmma_gmm_416x256x256_e3_bf16_rhsT_i32_tma_swiglu_grad_e4m3_rceil_col_e5m2_floor_kernel(
// PTXALWAYS: shfl.sync.bfly.b32 {{.*}}, 4, 31, -1;
// PTXALWAYS: shfl.sync.bfly.b32 {{.*}}, 8, 31, -1;
// PTXALWAYS: shfl.sync.bfly.b32 {{.*}}, 16, 31, -1;
// PTXALWAYS: st.shared.v4.b32
// PTXALWAYS: bar.sync {{.*}}, 64;
// PTXALWAYS: ld.shared.v4.b32
// PTXALWAYS: cvt.rn.satfinite.e5m2x2.f32
