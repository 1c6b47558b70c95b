// RUN: moe-opt %s -split-input-file -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics --mlir-print-op-generic \
// RUN:   | moe-opt -split-input-file | FileCheck %s

// moe.grouped_mlp_backward: round trip of every form (custom and generic
// printing parse back to the same op), then every verifier error.

// CHECK-LABEL: func.func @plain
// CHECK-SAME: (%[[X:.*]]: tensor<12x16xbf16>, %[[W1:.*]]: tensor<4x16x64xbf16>, %[[W2:.*]]: tensor<4x32x8xbf16>, %[[OFF:.*]]: tensor<5xi32>, %[[DY:.*]]: tensor<12x8xf32>)
// CHECK: = moe.grouped_mlp_backward %[[X]], %[[W1]], %[[W2]], %[[OFF]], %[[DY]] : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x8xbf16>, tensor<5xi32>, tensor<12x8xf32> -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x8xbf16>
func.func @plain(%x: tensor<12x16xbf16>, %w1: tensor<4x16x64xbf16>, %w2: tensor<4x32x8xbf16>,
                 %off: tensor<5xi32>, %dy: tensor<12x8xf32>)
    -> (tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x8xbf16>) {
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x8xbf16>, tensor<5xi32>, tensor<12x8xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x8xbf16>
  return %dx, %dw1, %dw2 : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x8xbf16>
}

// -----

// CHECK-LABEL: func.func @all_attributes
// CHECK: moe.grouped_mlp_backward %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} layout(interleaved) gemm_type(f8E4M3FN) scale(floor) {moe.layer = 3 : i64} : tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>, tensor<3xi64>, tensor<64x32xf32> -> tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>
// CHECK: moe.grouped_mlp_backward %{{.*}} gemm_type(f8E5M2) : tensor<64x32xf32>
// CHECK: moe.grouped_mlp_backward %{{.*}} gemm_type(bf16) : tensor<64x32xf32>
// The default scale mode (rceil) and layout (split) are not printed.
// CHECK: moe.grouped_mlp_backward %{{.*}} gemm_type(f8E4M3FN) : tensor<64x32xf32>
func.func @all_attributes(%x: tensor<64x32xf32>, %w1: tensor<2x32x64xf32>, %w2: tensor<2x32x32xf32>,
                          %off: tensor<3xi64>, %dy: tensor<64x32xf32>) {
  %a:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy layout(interleaved)
      gemm_type(f8E4M3FN) scale(floor) {moe.layer = 3}
      : tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>, tensor<3xi64>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>
  %b:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f8E5M2)
      : tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>, tensor<3xi64>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>
  %c:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(bf16)
      : tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>, tensor<3xi64>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>
  %d:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy layout(split) gemm_type(f8E4M3FN) scale(rceil)
      : tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>, tensor<3xi64>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<2x32x64xf32>, tensor<2x32x32xf32>
  return
}

// -----

// MX: F itself is never a contraction dimension of the definition (2F is):
// F = 16 is fine.
// CHECK-LABEL: func.func @mx_small_ffn
// CHECK: moe.grouped_mlp_backward {{.*}} gemm_type(f8E4M3FN) : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<4x16x32xf32>
func.func @mx_small_ffn(%x: tensor<64x32xf32>, %w1: tensor<4x32x32xf32>, %w2: tensor<4x16x32xf32>,
                        %off: tensor<5xi32>, %dy: tensor<64x32xf32>) {
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f8E4M3FN)
      : tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<4x16x32xf32>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x32xf32>, tensor<4x16x32xf32>
  return
}

// -----

// Dynamic rows are fine without an MX gemm_type.
// CHECK-LABEL: func.func @dynamic_rows
// CHECK: moe.grouped_mlp_backward {{.*}} gemm_type(bf16) : tensor<?x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<?x16xf32> -> tensor<?x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
func.func @dynamic_rows(%x: tensor<?x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                        %off: tensor<5xi32>, %dy: tensor<?x16xf32>) {
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(bf16)
      : tensor<?x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<?x16xf32>
      -> tensor<?x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
  return
}

// -----

func.func @x_rank(%x: tensor<12xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                  %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{'moe.grouped_mlp_backward' op expects x to have rank 2, got rank 1 ('tensor<12xf32>')}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
  return
}

// -----

func.func @offsets_count(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                         %off: tensor<4xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects 5 offsets (one more than the 4 experts), got 4}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<4xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
  return
}

// -----

func.func @w2_experts(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<3x32x16xf32>,
                      %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects w2 dim 0 (experts) to be 4, got 3}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<3x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<3x32x16xf32>
  return
}

// -----

func.func @hidden(%x: tensor<12x8xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                  %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects w1 dim 1 (hidden, x dim 1) to be 8, got 16}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x8xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x8xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
  return
}

// -----

func.func @dy_rows(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                   %off: tensor<5xi32>, %dy: tensor<10x16xf32>) {
  // expected-error @+1 {{expects dy dim 0 (rows, x dim 0) to be 12, got 10}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<10x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
  return
}

// -----

func.func @dy_cols(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x8xf32>,
                   %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects dy dim 1 (w2 dim 2) to be 8, got 16}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x8xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x8xf32>
  return
}

// -----

func.func @odd_gate_up(%x: tensor<12x16xf32>, %w1: tensor<4x16x63xf32>, %w2: tensor<4x31x16xf32>,
                       %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects w1 dim 2 (gate and up, 2 x ffn) to be even, got 63}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x63xf32>, tensor<4x31x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x63xf32>, tensor<4x31x16xf32>
  return
}

// -----

func.func @dynamic_gate_up(%x: tensor<12x16xf32>, %w1: tensor<4x16x?xf32>, %w2: tensor<4x32x16xf32>,
                           %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects a static w1 dim 2 (gate and up, 2 x ffn)}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x?xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x?xf32>, tensor<4x32x16xf32>
  return
}

// -----

func.func @ffn(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x16x16xf32>,
               %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects w2 dim 1 (ffn, half of w1 dim 2) to be 32, got 16}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x16x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x16x16xf32>
  return
}

// -----

func.func @dx_shape(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                    %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects dx dim 0 (from x) to be 12, got 16}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<16x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
  return
}

// -----

func.func @dw1_rank(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                    %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects w1 and dw1 to have the same rank, got 3 and 2}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<16x64xf32>, tensor<4x32x16xf32>
  return
}

// -----

func.func @dw2_shape(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                     %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects dw2 dim 2 (from w2) to be 16, got 8}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x8xf32>
  return
}

// -----

func.func @gemm_type_f16(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                         %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expects gemm_type to be bf16, f8E4M3FN or f8E5M2, got 'f16'}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f16)
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
  return
}

// -----

// MXFP8: every quantized dimension must be a static multiple of 32.
func.func @mx_rows(%x: tensor<40x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                   %off: tensor<5xi32>, %dy: tensor<40x32xf32>) {
  // expected-error @+1 {{expects rows (x dim 0) to be a static multiple of the MX block size 32 with gemm_type(f8E4M3FN), got 40}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f8E4M3FN)
      : tensor<40x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<40x32xf32>
      -> tensor<40x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return
}

// -----

func.func @mx_dynamic_rows(%x: tensor<?x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                           %off: tensor<5xi32>, %dy: tensor<?x32xf32>) {
  // expected-error @+1 {{expects rows (x dim 0) to be a static multiple of the MX block size 32 with gemm_type(f8E5M2), got ?}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f8E5M2)
      : tensor<?x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<?x32xf32>
      -> tensor<?x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>
  return
}

// -----

func.func @mx_gate_up(%x: tensor<64x32xf32>, %w1: tensor<4x32x48xf32>, %w2: tensor<4x24x32xf32>,
                      %off: tensor<5xi32>, %dy: tensor<64x32xf32>) {
  // expected-error @+1 {{expects gate and up (w1 dim 2) to be a static multiple of the MX block size 32 with gemm_type(f8E4M3FN), got 48}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f8E4M3FN)
      : tensor<64x32xf32>, tensor<4x32x48xf32>, tensor<4x24x32xf32>, tensor<5xi32>, tensor<64x32xf32>
      -> tensor<64x32xf32>, tensor<4x32x48xf32>, tensor<4x24x32xf32>
  return
}

// -----

func.func @mx_output(%x: tensor<64x32xf32>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x48xf32>,
                     %off: tensor<5xi32>, %dy: tensor<64x48xf32>) {
  // expected-error @+1 {{expects output (w2 dim 2) to be a static multiple of the MX block size 32 with gemm_type(f8E4M3FN), got 48}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy gemm_type(f8E4M3FN)
      : tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x48xf32>, tensor<5xi32>, tensor<64x48xf32>
      -> tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x48xf32>
  return
}

// -----

// Operands are the high-precision values: block-scaled ones are refused
// (the op quantizes them itself, along two axes).
func.func @mx_operand(%x: !moe.mx<64x32xf8E4M3FN, axis = 1>, %w1: tensor<4x32x64xf32>, %w2: tensor<4x32x32xf32>,
                      %off: tensor<5xi32>, %dy: tensor<64x32xf32>) {
  // expected-error @+1 {{operand #0 must be ranked tensor of 32-bit float or bfloat16 type or 16-bit float values}}
  %r:3 = "moe.grouped_mlp_backward"(%x, %w1, %w2, %off, %dy)
      : (!moe.mx<64x32xf8E4M3FN, axis = 1>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32>, tensor<64x32xf32>)
      -> (tensor<64x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>)
  return
}

// -----

func.func @bad_layout(%x: tensor<12x16xf32>, %w1: tensor<4x16x64xf32>, %w2: tensor<4x32x16xf32>,
                      %off: tensor<5xi32>, %dy: tensor<12x16xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'layout' [split, interleaved]}}
  %r:3 = moe.grouped_mlp_backward %x, %w1, %w2, %off, %dy layout(gated)
      : tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>, tensor<5xi32>, tensor<12x16xf32>
      -> tensor<12x16xf32>, tensor<4x16x64xf32>, tensor<4x32x16xf32>
  return
}
