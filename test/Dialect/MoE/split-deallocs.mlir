// RUN: moe-opt %s -split-input-file -moe-split-deallocs | FileCheck %s
// RUN: moe-opt %s -split-input-file -moe-split-deallocs \
// RUN:   -buffer-deallocation-simplification -bufferization-lower-deallocations \
// RUN:   -canonicalize | FileCheck %s --check-prefix=LOWERED

// Allocations that no other operand views are freed on their own, in operand
// order and under their own conditions (a view frees its allocation); a
// retained allocation and the argument stay with the retained values.
// CHECK-LABEL: func.func @split
// CHECK-SAME:    (%[[ARG:.*]]: memref<8xf32>, %[[C:.*]]: i1)
// CHECK:         %[[A:.*]] = memref.alloc() : memref<8xf32>
// CHECK:         %[[B:.*]] = memref.alloc() : memref<16xf32>
// CHECK:         %[[R:.*]] = memref.alloc() : memref<4xf32>
// CHECK:         %[[V:.*]] = memref.subview %[[B]]
// CHECK:         bufferization.dealloc (%[[A]] : memref<8xf32>) if (%true){{$}}
// CHECK-NEXT:    bufferization.dealloc (%[[V]] : memref<8xf32, strided<[1], offset: 8>>) if (%[[C]]){{$}}
// CHECK-NEXT:    %[[O:.*]]:2 = bufferization.dealloc (%[[R]], %[[ARG]] : memref<4xf32>, memref<8xf32>) if (%true, %[[C]]) retain (%[[R]], %[[ARG]] : memref<4xf32>, memref<8xf32>)
// CHECK-NEXT:    return %[[R]], %[[ARG]], %[[O]]#0, %[[O]]#1
// The upstream simplification and lowering take it from there.
// LOWERED-LABEL: func.func @split
// LOWERED:         scf.if %{{.*}} {
// LOWERED-NEXT:      memref.dealloc %{{.*}} : memref<8xf32, strided<[1], offset: 8>>
// LOWERED:         return
// LOWERED-NOT:     bufferization.dealloc
func.func @split(%arg: memref<8xf32>, %c: i1)
    -> (memref<4xf32>, memref<8xf32>, i1, i1) {
  %true = arith.constant true
  %a = memref.alloc() : memref<8xf32>
  %b = memref.alloc() : memref<16xf32>
  %r = memref.alloc() : memref<4xf32>
  %v = memref.subview %b[8] [8] [1]
      : memref<16xf32> to memref<8xf32, strided<[1], offset: 8>>
  %o:2 = bufferization.dealloc (%a, %v, %r, %arg
      : memref<8xf32>, memref<8xf32, strided<[1], offset: 8>>, memref<4xf32>,
        memref<8xf32>)
      if (%true, %c, %true, %c)
      retain (%r, %arg : memref<4xf32>, memref<8xf32>)
  return %r, %arg, %o#0, %o#1 : memref<4xf32>, memref<8xf32>, i1, i1
}

// -----

// Two operands that view one allocation may be the same buffer: neither is
// split off.
// CHECK-LABEL: func.func @same_allocation
// CHECK:         bufferization.dealloc (%{{.*}}, %{{.*}} : memref<8xf32>, memref<4xf32, strided<[1], offset: 4>>) if
// CHECK-NOT:     bufferization.dealloc
func.func @same_allocation(%c: i1) {
  %true = arith.constant true
  %a = memref.alloc() : memref<8xf32>
  %v = memref.subview %a[4] [4] [1]
      : memref<8xf32> to memref<4xf32, strided<[1], offset: 4>>
  bufferization.dealloc (%a, %v
      : memref<8xf32>, memref<4xf32, strided<[1], offset: 4>>)
      if (%true, %c)
  return
}

// -----

func.func private @make() -> memref<8xf32>

// An operand of unknown buffer (a call's result) may alias any other: the
// dealloc is left whole.
// CHECK-LABEL: func.func @unknown
// CHECK:         bufferization.dealloc (%{{.*}}, %{{.*}} : memref<8xf32>, memref<8xf32>) if
// CHECK-NOT:     bufferization.dealloc
func.func @unknown(%c: i1) {
  %true = arith.constant true
  %a = memref.alloc() : memref<8xf32>
  %m = call @make() : () -> memref<8xf32>
  bufferization.dealloc (%a, %m : memref<8xf32>, memref<8xf32>)
      if (%true, %c)
  return
}

// -----

// A loop's iteration argument may be any of the buffers the loop was given:
// the dealloc is left whole.
// CHECK-LABEL: func.func @loop_argument
// CHECK:         scf.for
// CHECK:           bufferization.dealloc (%{{.*}}, %{{.*}} : memref<8xf32>, memref<8xf32>) if
// CHECK-NOT:       bufferization.dealloc
func.func @loop_argument(%c: i1, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %true = arith.constant true
  %a = memref.alloc() : memref<8xf32>
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%x = %a) -> (memref<8xf32>) {
    %b = memref.alloc() : memref<8xf32>
    bufferization.dealloc (%b, %x : memref<8xf32>, memref<8xf32>) if (%true, %c)
    scf.yield %x : memref<8xf32>
  }
  return
}
