// RUN: moe-opt %s --moe-group-experts --moe-cpu-pipeline | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s
// RUN: moe-opt %s --moe-cpu-pipeline | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s
// RUN: moe-opt %s --moe-group-experts | FileCheck %s --check-prefix=IR

// -moe-group-experts preserves results bit for bit. Each function @*_in is
// written the way a frontend writes experts (a moe.experts body, a loop over
// experts, unrolled per-expert matmuls); @*_ref is the same computation
// written by hand with grouped ops on all rows (which the pass leaves
// alone). Both RUNs (with and without the pass) print the same values, and
// in each run @count_diff prints the number of elements whose bits differ
// between @*_in and @*_ref: 0. Without the pass that shows the frontend
// form and the grouped form agree bit for bit; with it, that the pass's
// output does too. The IR RUN checks the pass did convert every @*_in.
//
// Data: t[i, j] = ((i * a + j * b) mod 17) * 0.1 - 0.8 (not binary
// fractions, so sums round and their order matters); bf16 operands are
// those values rounded to bf16. Groups (E = 4, R = 9 rows): offsets
// [0, 3, 3, 7, 8]: expert 1 is empty and row 8 belongs to no expert, its
// tokens are not zero but its outputs must be.

// IR-LABEL: func.func @mlp_in(
// IR-NOT: moe.experts
// IR-COUNT-2: moe.grouped_matmul
// IR-LABEL: func.func @act_in(
// IR-NOT: moe.experts
// IR: moe.grouped_matmul {{.*}} transpose_rhs
// IR-LABEL: func.func @mlp_ref(
// IR-LABEL: func.func @loop_in(
// IR-NOT: scf.for
// IR-COUNT-2: moe.grouped_matmul
// IR-LABEL: func.func @unrolled_in(
// IR-NOT: linalg.matmul
// IR: moe.grouped_matmul
// IR-LABEL: func.func @concat_in(
// IR-NOT: linalg.matmul
// IR: moe.grouped_matmul
// IR-NOT: linalg.matmul
// IR-LABEL: func.func @unrolled_ref(

#id = affine_map<(i, j) -> (i, j)>

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

//===----------------------------------------------------------------------===//
// (a) moe.experts: the SwiGLU MLP in f32
//===----------------------------------------------------------------------===//

func.func @mlp_in(%x: tensor<9x8xf32>, %off: tensor<5xi32>, %w1: tensor<4x8x12xf32>,
                  %w2: tensor<4x6x8xf32>) -> tensor<9x8xf32> {
  %y = moe.experts %x, %off weights(%w1, %w2 : tensor<4x8x12xf32>, tensor<4x6x8xf32>)
      : tensor<9x8xf32>, tensor<5xi32> -> tensor<9x8xf32> {
  ^bb0(%xg: tensor<?x8xf32>, %a: tensor<8x12xf32>, %b: tensor<6x8xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x8xf32>
    %e1 = tensor.empty(%n) : tensor<?x12xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x12xf32>) -> tensor<?x12xf32>
    %h = linalg.matmul ins(%xg, %a : tensor<?x8xf32>, tensor<8x12xf32>)
                       outs(%z1 : tensor<?x12xf32>) -> tensor<?x12xf32>
    %act = moe.swiglu %h : tensor<?x12xf32> -> tensor<?x6xf32>
    %e2 = tensor.empty(%n) : tensor<?x8xf32>
    %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x8xf32>) -> tensor<?x8xf32>
    %o = linalg.matmul ins(%act, %b : tensor<?x6xf32>, tensor<6x8xf32>)
                       outs(%z2 : tensor<?x8xf32>) -> tensor<?x8xf32>
    moe.yield %o : tensor<?x8xf32>
  }
  return %y : tensor<9x8xf32>
}

//===----------------------------------------------------------------------===//
// (a) moe.experts: bf16, transposed weights, elementwise silu(h) * h in a
//     linalg.generic and arith on tensors, rounded to bf16
//===----------------------------------------------------------------------===//

func.func @act_in(%x: tensor<9x8xbf16>, %off: tensor<5xi32>, %wt: tensor<4x12x8xbf16>)
    -> tensor<9x12xbf16> {
  %y = moe.experts %x, %off weights(%wt : tensor<4x12x8xbf16>)
      : tensor<9x8xbf16>, tensor<5xi32> -> tensor<9x12xbf16> {
  ^bb0(%xg: tensor<?x8xbf16>, %a: tensor<12x8xbf16>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %n = tensor.dim %xg, %c0 : tensor<?x8xbf16>
    %et = tensor.empty() : tensor<8x12xbf16>
    %at = linalg.transpose ins(%a : tensor<12x8xbf16>) outs(%et : tensor<8x12xbf16>) permutation = [1, 0]
    %e = tensor.empty(%n) : tensor<?x12xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x12xf32>) -> tensor<?x12xf32>
    %h = linalg.matmul ins(%xg, %at : tensor<?x8xbf16>, tensor<8x12xbf16>)
                       outs(%z : tensor<?x12xf32>) -> tensor<?x12xf32>
    %s = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%h : tensor<?x12xf32>) outs(%e : tensor<?x12xf32>) {
    ^bb0(%v: f32, %unused: f32):
      %one = arith.constant 1.0 : f32
      %nv = arith.negf %v : f32
      %ex = math.exp %nv : f32
      %d = arith.addf %one, %ex : f32
      %r = arith.divf %v, %d : f32
      linalg.yield %r : f32
    } -> tensor<?x12xf32>
    %p = arith.mulf %s, %h : tensor<?x12xf32>
    %t = arith.truncf %p : tensor<?x12xf32> to tensor<?x12xbf16>
    moe.yield %t : tensor<?x12xbf16>
  }
  return %y : tensor<9x12xbf16>
}

func.func @act_ref(%x: tensor<9x8xbf16>, %off: tensor<5xi32>, %wt: tensor<4x12x8xbf16>)
    -> tensor<9x12xbf16> {
  %h = moe.grouped_matmul %x, %wt, %off transpose_rhs
      : tensor<9x8xbf16>, tensor<4x12x8xbf16>, tensor<5xi32> -> tensor<9x12xf32>
  %e = tensor.empty() : tensor<9x12xf32>
  %s = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%h : tensor<9x12xf32>) outs(%e : tensor<9x12xf32>) {
  ^bb0(%v: f32, %unused: f32):
    %one = arith.constant 1.0 : f32
    %nv = arith.negf %v : f32
    %ex = math.exp %nv : f32
    %d = arith.addf %one, %ex : f32
    %r = arith.divf %v, %d : f32
    linalg.yield %r : f32
  } -> tensor<9x12xf32>
  %p = arith.mulf %s, %h : tensor<9x12xf32>
  %t = arith.truncf %p : tensor<9x12xf32> to tensor<9x12xbf16>
  return %t : tensor<9x12xbf16>
}

/// The SwiGLU MLP with grouped ops; the swiglu result is rounded to `w2`'s
/// element type (f32 or bf16).
func.func @mlp_ref(%x: tensor<9x8xf32>, %off: tensor<5xi32>, %w1: tensor<4x8x12xf32>,
                   %w2: tensor<4x6x8xf32>) -> tensor<9x8xf32> {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<9x8xf32>, tensor<4x8x12xf32>, tensor<5xi32> -> tensor<9x12xf32>
  %a = moe.swiglu %h : tensor<9x12xf32> -> tensor<9x6xf32>
  %y = moe.grouped_matmul %a, %w2, %off
      : tensor<9x6xf32>, tensor<4x6x8xf32>, tensor<5xi32> -> tensor<9x8xf32>
  return %y : tensor<9x8xf32>
}
func.func @mlp_ref_bf16(%x: tensor<9x8xbf16>, %off: tensor<5xi64>, %w1: tensor<4x8x12xbf16>,
                        %w2: tensor<4x6x8xbf16>) -> tensor<9x8xf32> {
  %h = moe.grouped_matmul %x, %w1, %off
      : tensor<9x8xbf16>, tensor<4x8x12xbf16>, tensor<5xi64> -> tensor<9x12xf32>
  %a = moe.swiglu %h : tensor<9x12xf32> -> tensor<9x6xbf16>
  %y = moe.grouped_matmul %a, %w2, %off
      : tensor<9x6xbf16>, tensor<4x6x8xbf16>, tensor<5xi64> -> tensor<9x8xf32>
  return %y : tensor<9x8xf32>
}

//===----------------------------------------------------------------------===//
// (b) a loop over experts, bf16 operands, i64 offsets
//===----------------------------------------------------------------------===//

func.func @loop_in(%x: tensor<9x8xbf16>, %off: tensor<5xi64>, %w1: tensor<4x8x12xbf16>,
                   %w2: tensor<4x6x8xbf16>) -> tensor<9x8xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<9x8xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<9x8xf32>) -> tensor<9x8xf32>
  %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc = %init) -> (tensor<9x8xf32>) {
    %lo64 = tensor.extract %off[%i] : tensor<5xi64>
    %i1 = arith.addi %i, %c1 : index
    %hi64 = tensor.extract %off[%i1] : tensor<5xi64>
    %lo = arith.index_cast %lo64 : i64 to index
    %hi = arith.index_cast %hi64 : i64 to index
    %n = arith.subi %hi, %lo : index
    %xs = tensor.extract_slice %x[%lo, 0] [%n, 8] [1, 1] : tensor<9x8xbf16> to tensor<?x8xbf16>
    %a = tensor.extract_slice %w1[%i, 0, 0] [1, 8, 12] [1, 1, 1] : tensor<4x8x12xbf16> to tensor<8x12xbf16>
    %b = tensor.extract_slice %w2[%i, 0, 0] [1, 6, 8] [1, 1, 1] : tensor<4x6x8xbf16> to tensor<6x8xbf16>
    %e1 = tensor.empty(%n) : tensor<?x12xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x12xf32>) -> tensor<?x12xf32>
    %h = linalg.matmul ins(%xs, %a : tensor<?x8xbf16>, tensor<8x12xbf16>)
                       outs(%z1 : tensor<?x12xf32>) -> tensor<?x12xf32>
    %act = moe.swiglu %h : tensor<?x12xf32> -> tensor<?x6xbf16>
    %e2 = tensor.empty(%n) : tensor<?x8xf32>
    %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x8xf32>) -> tensor<?x8xf32>
    %y = linalg.matmul ins(%act, %b : tensor<?x6xbf16>, tensor<6x8xbf16>)
                       outs(%z2 : tensor<?x8xf32>) -> tensor<?x8xf32>
    %acc2 = tensor.insert_slice %y into %acc[%lo, 0] [%n, 8] [1, 1]
        : tensor<?x8xf32> into tensor<9x8xf32>
    scf.yield %acc2 : tensor<9x8xf32>
  }
  return %r : tensor<9x8xf32>
}

//===----------------------------------------------------------------------===//
// (c) unrolled per-expert matmuls: groups of 3, 0, 4 and 1 rows
//===----------------------------------------------------------------------===//

/// Slice e of `w` times rows [s, s + n) of `x`, f32.
func.func @unrolled_in(%x: tensor<9x8xf32>, %w: tensor<4x8x6xf32>) -> tensor<9x6xf32> {
  %zero = arith.constant 0.0 : f32
  %out0 = tensor.empty() : tensor<9x6xf32>
  %out = linalg.fill ins(%zero : f32) outs(%out0 : tensor<9x6xf32>) -> tensor<9x6xf32>
  %x0 = tensor.extract_slice %x[0, 0] [3, 8] [1, 1] : tensor<9x8xf32> to tensor<3x8xf32>
  %w0 = tensor.extract_slice %w[0, 0, 0] [1, 8, 6] [1, 1, 1] : tensor<4x8x6xf32> to tensor<8x6xf32>
  %e0 = tensor.empty() : tensor<3x6xf32>
  %z0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<3x6xf32>) -> tensor<3x6xf32>
  %y0 = linalg.matmul ins(%x0, %w0 : tensor<3x8xf32>, tensor<8x6xf32>) outs(%z0 : tensor<3x6xf32>) -> tensor<3x6xf32>
  %x1 = tensor.extract_slice %x[3, 0] [0, 8] [1, 1] : tensor<9x8xf32> to tensor<0x8xf32>
  %w1 = tensor.extract_slice %w[1, 0, 0] [1, 8, 6] [1, 1, 1] : tensor<4x8x6xf32> to tensor<8x6xf32>
  %e1 = tensor.empty() : tensor<0x6xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<0x6xf32>) -> tensor<0x6xf32>
  %y1 = linalg.matmul ins(%x1, %w1 : tensor<0x8xf32>, tensor<8x6xf32>) outs(%z1 : tensor<0x6xf32>) -> tensor<0x6xf32>
  %x2 = tensor.extract_slice %x[3, 0] [4, 8] [1, 1] : tensor<9x8xf32> to tensor<4x8xf32>
  %w2 = tensor.extract_slice %w[2, 0, 0] [1, 8, 6] [1, 1, 1] : tensor<4x8x6xf32> to tensor<8x6xf32>
  %e2 = tensor.empty() : tensor<4x6xf32>
  %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<4x6xf32>) -> tensor<4x6xf32>
  %y2 = linalg.matmul ins(%x2, %w2 : tensor<4x8xf32>, tensor<8x6xf32>) outs(%z2 : tensor<4x6xf32>) -> tensor<4x6xf32>
  %x3 = tensor.extract_slice %x[7, 0] [1, 8] [1, 1] : tensor<9x8xf32> to tensor<1x8xf32>
  %w3 = tensor.extract_slice %w[3, 0, 0] [1, 8, 6] [1, 1, 1] : tensor<4x8x6xf32> to tensor<8x6xf32>
  %e3 = tensor.empty() : tensor<1x6xf32>
  %z3 = linalg.fill ins(%zero : f32) outs(%e3 : tensor<1x6xf32>) -> tensor<1x6xf32>
  %y3 = linalg.matmul ins(%x3, %w3 : tensor<1x8xf32>, tensor<8x6xf32>) outs(%z3 : tensor<1x6xf32>) -> tensor<1x6xf32>
  %r0 = tensor.insert_slice %y0 into %out[0, 0] [3, 6] [1, 1] : tensor<3x6xf32> into tensor<9x6xf32>
  %r1 = tensor.insert_slice %y1 into %r0[3, 0] [0, 6] [1, 1] : tensor<0x6xf32> into tensor<9x6xf32>
  %r2 = tensor.insert_slice %y2 into %r1[3, 0] [4, 6] [1, 1] : tensor<4x6xf32> into tensor<9x6xf32>
  %r3 = tensor.insert_slice %y3 into %r2[7, 0] [1, 6] [1, 1] : tensor<1x6xf32> into tensor<9x6xf32>
  return %r3 : tensor<9x6xf32>
}

/// Two experts (rows 0-4 and 5-8 of a bf16 x), separate transposed weights,
/// concatenated.
func.func @concat_in(%x: tensor<9x8xbf16>, %wa: tensor<6x8xbf16>, %wb: tensor<6x8xbf16>)
    -> tensor<9x6xf32> {
  %zero = arith.constant 0.0 : f32
  %x0 = tensor.extract_slice %x[0, 0] [5, 8] [1, 1] : tensor<9x8xbf16> to tensor<5x8xbf16>
  %e0 = tensor.empty() : tensor<5x6xf32>
  %z0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<5x6xf32>) -> tensor<5x6xf32>
  %ta = tensor.empty() : tensor<8x6xbf16>
  %wat = linalg.transpose ins(%wa : tensor<6x8xbf16>) outs(%ta : tensor<8x6xbf16>) permutation = [1, 0]
  %y0 = linalg.matmul ins(%x0, %wat : tensor<5x8xbf16>, tensor<8x6xbf16>) outs(%z0 : tensor<5x6xf32>) -> tensor<5x6xf32>
  %x1 = tensor.extract_slice %x[5, 0] [4, 8] [1, 1] : tensor<9x8xbf16> to tensor<4x8xbf16>
  %e1 = tensor.empty() : tensor<4x6xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<4x6xf32>) -> tensor<4x6xf32>
  %tb = tensor.empty() : tensor<8x6xbf16>
  %wbt = linalg.transpose ins(%wb : tensor<6x8xbf16>) outs(%tb : tensor<8x6xbf16>) permutation = [1, 0]
  %y1 = linalg.matmul ins(%x1, %wbt : tensor<4x8xbf16>, tensor<8x6xbf16>) outs(%z1 : tensor<4x6xf32>) -> tensor<4x6xf32>
  %r = tensor.concat dim(0) %y0, %y1 : (tensor<5x6xf32>, tensor<4x6xf32>) -> tensor<9x6xf32>
  return %r : tensor<9x6xf32>
}

func.func @unrolled_ref(%x: tensor<9x8xf32>, %w: tensor<4x8x6xf32>) -> tensor<9x6xf32> {
  %off = arith.constant dense<[0, 3, 3, 7, 8]> : tensor<5xi32>
  %y = moe.grouped_matmul %x, %w, %off : tensor<9x8xf32>, tensor<4x8x6xf32>, tensor<5xi32> -> tensor<9x6xf32>
  return %y : tensor<9x6xf32>
}
func.func @concat_ref(%x: tensor<9x8xbf16>, %wa: tensor<6x8xbf16>, %wb: tensor<6x8xbf16>)
    -> tensor<9x6xf32> {
  %off = arith.constant dense<[0, 5, 9]> : tensor<3xi32>
  %e = tensor.empty() : tensor<2x6x8xbf16>
  %s0 = tensor.insert_slice %wa into %e[0, 0, 0] [1, 6, 8] [1, 1, 1] : tensor<6x8xbf16> into tensor<2x6x8xbf16>
  %s1 = tensor.insert_slice %wb into %s0[1, 0, 0] [1, 6, 8] [1, 1, 1] : tensor<6x8xbf16> into tensor<2x6x8xbf16>
  %y = moe.grouped_matmul %x, %s1, %off transpose_rhs : tensor<9x8xbf16>, tensor<2x6x8xbf16>, tensor<3xi32> -> tensor<9x6xf32>
  return %y : tensor<9x6xf32>
}

//===----------------------------------------------------------------------===//
// Helpers and main
//===----------------------------------------------------------------------===//

func.func @gen(%d0: index, %d1: index, %a: index, %b: index) -> tensor<?x?xf32> {
  %e = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %r = linalg.generic {indexing_maps = [#id], iterator_types = ["parallel", "parallel"]}
      outs(%e : tensor<?x?xf32>) {
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %ia = arith.muli %i, %a : index
    %jb = arith.muli %j, %b : index
    %s = arith.addi %ia, %jb : index
    %c17 = arith.constant 17 : index
    %m = arith.remui %s, %c17 : index
    %mi = arith.index_cast %m : index to i32
    %mf = arith.sitofp %mi : i32 to f32
    %tenth = arith.constant 0.1 : f32
    %c8 = arith.constant 0.8 : f32
    %v = arith.mulf %mf, %tenth : f32
    %w = arith.subf %v, %c8 : f32
    linalg.yield %w : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
func.func @to_bf16(%t: tensor<?x?xf32>) -> tensor<?x?xbf16> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xf32>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xbf16>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<?x?xf32>) outs(%e : tensor<?x?xbf16>) {
  ^bb0(%v: f32, %o: bf16):
    %b = arith.truncf %v : f32 to bf16
    linalg.yield %b : bf16
  } -> tensor<?x?xbf16>
  return %r : tensor<?x?xbf16>
}
func.func @to_f32(%t: tensor<?x?xbf16>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xbf16>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xbf16>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<?x?xbf16>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%v: bf16, %o: f32):
    %b = arith.extf %v : bf16 to f32
    linalg.yield %b : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
func.func @pf(%t: tensor<?x?xf32>) {
  %u = tensor.cast %t : tensor<?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}
/// Prints the number of elements whose bit patterns differ (0 = identical).
func.func @count_diff(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) {
  %zero = arith.constant 0 : i32
  %e = tensor.empty() : tensor<1xi32>
  %init = linalg.fill ins(%zero : i32) outs(%e : tensor<1xi32>) -> tensor<1xi32>
  %r = linalg.generic {
      indexing_maps = [#id, #id, affine_map<(i, j) -> (0)>],
      iterator_types = ["reduction", "reduction"]}
      ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>) outs(%init : tensor<1xi32>) {
  ^bb0(%x: f32, %y: f32, %acc: i32):
    %xb = arith.bitcast %x : f32 to i32
    %yb = arith.bitcast %y : f32 to i32
    %ne = arith.cmpi ne, %xb, %yb : i32
    %one = arith.extui %ne : i1 to i32
    %s = arith.addi %acc, %one : i32
    linalg.yield %s : i32
  } -> tensor<1xi32>
  %u = tensor.cast %r : tensor<1xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}
/// Prints `a` and the bit-difference count of `a` and `b`.
func.func @report(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) {
  call @pf(%a) : (tensor<?x?xf32>) -> ()
  call @count_diff(%a, %b) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  return
}

func.func @main() {
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %c6 = arith.constant 6 : index
  %c7 = arith.constant 7 : index
  %c8 = arith.constant 8 : index
  %c9 = arith.constant 9 : index
  %c11 = arith.constant 11 : index
  %c12 = arith.constant 12 : index
  %c24 = arith.constant 24 : index
  %c32 = arith.constant 32 : index
  %c48 = arith.constant 48 : index
  %off = arith.constant dense<[0, 3, 3, 7, 8]> : tensor<5xi32>
  %off64 = arith.constant dense<[0, 3, 3, 7, 8]> : tensor<5xi64>

  %xd = call @gen(%c9, %c8, %c3, %c5) : (index, index, index, index) -> tensor<?x?xf32>
  %w1d = call @gen(%c32, %c12, %c7, %c3) : (index, index, index, index) -> tensor<?x?xf32>
  %w2d = call @gen(%c24, %c8, %c5, %c11) : (index, index, index, index) -> tensor<?x?xf32>
  %wtd = call @gen(%c48, %c8, %c6, %c1) : (index, index, index, index) -> tensor<?x?xf32>
  %w3d = call @gen(%c32, %c6, %c11, %c7) : (index, index, index, index) -> tensor<?x?xf32>
  %xbd = call @to_bf16(%xd) : (tensor<?x?xf32>) -> tensor<?x?xbf16>
  %w1bd = call @to_bf16(%w1d) : (tensor<?x?xf32>) -> tensor<?x?xbf16>
  %w2bd = call @to_bf16(%w2d) : (tensor<?x?xf32>) -> tensor<?x?xbf16>
  %wtbd = call @to_bf16(%wtd) : (tensor<?x?xf32>) -> tensor<?x?xbf16>

  %x = tensor.cast %xd : tensor<?x?xf32> to tensor<9x8xf32>
  %xb = tensor.cast %xbd : tensor<?x?xbf16> to tensor<9x8xbf16>
  %w1f = tensor.cast %w1d : tensor<?x?xf32> to tensor<32x12xf32>
  %w1 = tensor.expand_shape %w1f [[0, 1], [2]] output_shape [4, 8, 12] : tensor<32x12xf32> into tensor<4x8x12xf32>
  %w2f = tensor.cast %w2d : tensor<?x?xf32> to tensor<24x8xf32>
  %w2 = tensor.expand_shape %w2f [[0, 1], [2]] output_shape [4, 6, 8] : tensor<24x8xf32> into tensor<4x6x8xf32>
  %w1bf = tensor.cast %w1bd : tensor<?x?xbf16> to tensor<32x12xbf16>
  %w1b = tensor.expand_shape %w1bf [[0, 1], [2]] output_shape [4, 8, 12] : tensor<32x12xbf16> into tensor<4x8x12xbf16>
  %w2bf = tensor.cast %w2bd : tensor<?x?xbf16> to tensor<24x8xbf16>
  %w2b = tensor.expand_shape %w2bf [[0, 1], [2]] output_shape [4, 6, 8] : tensor<24x8xbf16> into tensor<4x6x8xbf16>
  %wtbf = tensor.cast %wtbd : tensor<?x?xbf16> to tensor<48x8xbf16>
  %wtb = tensor.expand_shape %wtbf [[0, 1], [2]] output_shape [4, 12, 8] : tensor<48x8xbf16> into tensor<4x12x8xbf16>
  %w3f = tensor.cast %w3d : tensor<?x?xf32> to tensor<32x6xf32>
  %w3 = tensor.expand_shape %w3f [[0, 1], [2]] output_shape [4, 8, 6] : tensor<32x6xf32> into tensor<4x8x6xf32>
  %wa = tensor.extract_slice %wtb[0, 0, 0] [1, 6, 8] [1, 1, 1] : tensor<4x12x8xbf16> to tensor<6x8xbf16>
  %wb = tensor.extract_slice %wtb[2, 6, 0] [1, 6, 8] [1, 1, 1] : tensor<4x12x8xbf16> to tensor<6x8xbf16>

  // 1. (a) the f32 SwiGLU MLP.
  %y1 = call @mlp_in(%x, %off, %w1, %w2)
      : (tensor<9x8xf32>, tensor<5xi32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>) -> tensor<9x8xf32>
  %r1 = call @mlp_ref(%x, %off, %w1, %w2)
      : (tensor<9x8xf32>, tensor<5xi32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>) -> tensor<9x8xf32>
  %y1_ = tensor.cast %y1 : tensor<9x8xf32> to tensor<?x?xf32>
  %r1_ = tensor.cast %r1 : tensor<9x8xf32> to tensor<?x?xf32>
  call @report(%y1_, %r1_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()

  // 2. (a) bf16, transposed weights, elementwise ops.
  %y2 = call @act_in(%xb, %off, %wtb)
      : (tensor<9x8xbf16>, tensor<5xi32>, tensor<4x12x8xbf16>) -> tensor<9x12xbf16>
  %r2 = call @act_ref(%xb, %off, %wtb)
      : (tensor<9x8xbf16>, tensor<5xi32>, tensor<4x12x8xbf16>) -> tensor<9x12xbf16>
  %y2d = tensor.cast %y2 : tensor<9x12xbf16> to tensor<?x?xbf16>
  %r2d = tensor.cast %r2 : tensor<9x12xbf16> to tensor<?x?xbf16>
  %y2_ = call @to_f32(%y2d) : (tensor<?x?xbf16>) -> tensor<?x?xf32>
  %r2_ = call @to_f32(%r2d) : (tensor<?x?xbf16>) -> tensor<?x?xf32>
  call @report(%y2_, %r2_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()

  // 3. (b) the loop, bf16.
  %y3 = call @loop_in(%xb, %off64, %w1b, %w2b)
      : (tensor<9x8xbf16>, tensor<5xi64>, tensor<4x8x12xbf16>, tensor<4x6x8xbf16>) -> tensor<9x8xf32>
  %r3 = call @mlp_ref_bf16(%xb, %off64, %w1b, %w2b)
      : (tensor<9x8xbf16>, tensor<5xi64>, tensor<4x8x12xbf16>, tensor<4x6x8xbf16>) -> tensor<9x8xf32>
  %y3_ = tensor.cast %y3 : tensor<9x8xf32> to tensor<?x?xf32>
  %r3_ = tensor.cast %r3 : tensor<9x8xf32> to tensor<?x?xf32>
  call @report(%y3_, %r3_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()

  // 4. (c) unrolled, insert_slice chain.
  %y4 = call @unrolled_in(%x, %w3) : (tensor<9x8xf32>, tensor<4x8x6xf32>) -> tensor<9x6xf32>
  %r4 = call @unrolled_ref(%x, %w3) : (tensor<9x8xf32>, tensor<4x8x6xf32>) -> tensor<9x6xf32>
  %y4_ = tensor.cast %y4 : tensor<9x6xf32> to tensor<?x?xf32>
  %r4_ = tensor.cast %r4 : tensor<9x6xf32> to tensor<?x?xf32>
  call @report(%y4_, %r4_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()

  // 5. (c) unrolled, concat of two experts with separate weights.
  %y5 = call @concat_in(%xb, %wa, %wb)
      : (tensor<9x8xbf16>, tensor<6x8xbf16>, tensor<6x8xbf16>) -> tensor<9x6xf32>
  %r5 = call @concat_ref(%xb, %wa, %wb)
      : (tensor<9x8xbf16>, tensor<6x8xbf16>, tensor<6x8xbf16>) -> tensor<9x6xf32>
  %y5_ = tensor.cast %y5 : tensor<9x6xf32> to tensor<?x?xf32>
  %r5_ = tensor.cast %r5 : tensor<9x6xf32> to tensor<?x?xf32>
  call @report(%y5_, %r5_) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  return
}

// The values printed without the pass (the reference lowering); the run with
// the pass must print the same. Every result is followed by its bit-difference
// count against the grouped form (0). Row 8 belongs to no expert: zeros (but
// for the concat, whose experts cover all 9 rows). Outputs through math.exp
// (swiglu, silu) assume the platform expf the reference was run with; the
// in-IR bit comparison does not.
// 1. (a) f32 MLP
// CHECK-LABEL: sizes = [9, 8]
// CHECK-NEXT: {{\[}}[0.137941,   -0.492138,   0.717152,   0.0496534,   -0.603158,   0.606132,   -0.0613668,   -0.714178],
// CHECK-NEXT:  [0.136188,   0.00784942,   -0.0731928,   0.273466,   -0.0364591,   -0.117501,   0.229158,   -0.0807676],
// CHECK-NEXT:  [-0.0855485,   0.124999,   0.110706,   -0.0119055,   0.0891956,   0.0749021,   -0.0477093,   0.0533918],
// CHECK-NEXT:  [0.0476618,   0.00383079,   -0.0463572,   -0.00923096,   -0.0390675,   -0.0338299,   -0.0521293,   -0.140066],
// CHECK-NEXT:  [-0.409032,   0.209777,   0.0223341,   -0.0444882,   0.149568,   -0.194628,   -0.104698,   0.0538823],
// CHECK-NEXT:  [0.132142,   -0.59916,   0.499873,   0.0245522,   -0.677376,   0.351301,   -0.0536644,   -0.138842],
// CHECK-NEXT:  [0.261678,   -0.167344,   -0.21615,   0.0906032,   -0.234998,   -0.0130891,   0.0229496,   0.00194094],
// CHECK-NEXT:  [0.248759,   -0.0122237,   -0.296697,   0.169986,   -0.0909975,   -0.375471,   0.0912116,   -0.169771],
// CHECK-NEXT:  [0,   0,   0,   0,   0,   0,   0,   0]]
// CHECK: sizes = [1]
// CHECK-NEXT: {{^}}[0]
// 2. (a) bf16, transposed, elementwise
// CHECK: sizes = [9, 12]
// CHECK-NEXT: {{\[}}[0.193359,   5.96046e-05,   0.0164795,   0.130859,   0.00312805,   0.206055,   0.0820312,   0.0129395,   0.166992,   0.0449219,   0.029541,   0.314453],
// CHECK-NEXT:  [0.0588379,   0.0222168,   0.304688,   0.0515137,   0.0175781,   0.195312,   0.0449219,   0.0141602,   0.0849609,   0.0380859,   0.0105591,   0.0917969],
// CHECK-NEXT:  [0.0703125,   0.0067749,   0.0722656,   0.0563965,   0.00236511,   0.0297852,   0.0432129,   0.000218391,   0.667969,   0.0317383,   0.000514984,   0.0507812],
// CHECK-NEXT:  [0.0563965,   0.0722656,   0.0067749,   0.0703125,   1.38281,   0.0133057,   0.202148,   0.0351562,   0.0217285,   0.0507812,   0.000514984,   0.0317383],
// CHECK-NEXT:  [0.0515137,   0.304688,   0.0222168,   0.0588379,   0.121094,   0.0270996,   0.0976562,   0.445312,   0.0322266,   0.0917969,   0.0105591,   0.0380859],
// CHECK-NEXT:  [0.130859,   0.0164795,   5.96046e-05,   0.193359,   0.00491333,   0.00540161,   0.169922,   0.490234,   0.0198975,   0.314453,   0.029541,   0.0449219],
// CHECK-NEXT:  [0.00662231,   0.199219,   0.0136108,   0.00524902,   0.367188,   0.0119629,   0.933594,   0.265625,   0.0105591,   0.00338745,   0.0194092,   0.0090332],
// CHECK-NEXT:  [0.0158691,   0.0197754,   0.0854492,   0.0297852,   0.00338745,   0.121582,   0.988281,   0.000465393,   0.15918,   5.24521e-05,   0.00921631,   0.0361328],
// CHECK-NEXT:  [0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0]]
// CHECK: sizes = [1]
// CHECK-NEXT: {{^}}[0]
// 3. (b) loop, bf16
// CHECK: sizes = [9, 8]
// CHECK-NEXT: {{\[}}[0.138235,   -0.494244,   0.718286,   0.0495129,   -0.604262,   0.608947,   -0.0619621,   -0.716986],
// CHECK-NEXT:  [0.136509,   0.00812387,   -0.0734893,   0.273985,   -0.0362473,   -0.117844,   0.229,   -0.0807347],
// CHECK-NEXT:  [-0.0859697,   0.126346,   0.110476,   -0.012094,   0.0901775,   0.0750895,   -0.0478544,   0.0545937],
// CHECK-NEXT:  [0.048329,   0.0041163,   -0.0469406,   -0.00870752,   -0.0389393,   -0.0340875,   -0.0517485,   -0.140816],
// CHECK-NEXT:  [-0.409467,   0.20984,   0.0224662,   -0.0435631,   0.149533,   -0.194842,   -0.104584,   0.053566],
// CHECK-NEXT:  [0.133131,   -0.599173,   0.500634,   0.0244823,   -0.678653,   0.351403,   -0.0535116,   -0.137286],
// CHECK-NEXT:  [0.264259,   -0.168116,   -0.217678,   0.0905571,   -0.23635,   -0.0122485,   0.0226693,   0.00169349],
// CHECK-NEXT:  [0.249824,   -0.0125244,   -0.2977,   0.170925,   -0.0917627,   -0.377361,   0.092258,   -0.171324],
// CHECK-NEXT:  [0,   0,   0,   0,   0,   0,   0,   0]]
// CHECK: sizes = [1]
// CHECK-NEXT: {{^}}[0]
// 4. (c) insert_slice chain
// CHECK: sizes = [9, 6]
// CHECK-NEXT: {{\[}}[1.23,   -0.08,   0.14,   -1.17,   0.75,   -0.0499999],
// CHECK-NEXT:  [0.05,   0.0800001,   -0.74,   -0.2,   0.68,   1.22],
// CHECK-NEXT:  [-0.96,   0.41,   -1.45,   0.94,   0.78,   -0.23],
// CHECK-NEXT:  [-0.23,   0.78,   0.94,   -1.45,   0.41,   -0.96],
// CHECK-NEXT:  [1.22,   0.68,   -0.2,   -0.74,   0.0799999,   0.05],
// CHECK-NEXT:  [-0.05,   0.75,   -1.17,   0.14,   -0.0799999,   1.23],
// CHECK-NEXT:  [-0.81,   0.14,   -1.12,   0.85,   1.29,   -0.14],
// CHECK-NEXT:  [0.82,   -1.65,   0.47,   -1.32,   0.97,   0.71],
// CHECK-NEXT:  [0,   0,   0,   0,   0,   0]]
// CHECK: sizes = [1]
// CHECK-NEXT: {{^}}[0]
// 5. (c) concat
// CHECK: sizes = [9, 6]
// CHECK-NEXT: {{\[}}[0.551611,   0.0108986,   -0.191055,   0.461143,   -0.0808387,   0.567791],
// CHECK-NEXT:  [0.318671,   0.200929,   -1.10855,   0.299414,   0.179863,   -0.791836],
// CHECK-NEXT:  [-0.422091,   -0.120039,   0.351269,   -0.371359,   -0.0699897,   0.231283],
// CHECK-NEXT:  [0.0318694,   -0.27131,   0.96075,   -0.021018,   -0.32043,   0.231283],
// CHECK-NEXT:  [0.140518,   0.259629,   0.378494,   0.161779,   0.28079,   -0.791836],
// CHECK-NEXT:  [-0.721405,   0.838514,   0.190812,   -1.1391,   -0.260508,   0.280743],
// CHECK-NEXT:  [1.1132,   -0.992032,   0.140322,   0.0807419,   0.188562,   0.130206],
// CHECK-NEXT:  [-0.290615,   -0.268717,   -0.250977,   0.96075,   0.299607,   -0.360703],
// CHECK-NEXT:  [-0.161679,   0.110411,   0.0397363,   0.649168,   0.241936,   4.81606e-05]]
// CHECK: sizes = [1]
// CHECK-NEXT: {{^}}[0]
