// RUN: moe-opt %s -split-input-file -moe-buffer-lifetimes | FileCheck %s

// A buffer is allocated at its first use and freed after its last, not at the
// top of the function and at its end.
// CHECK-LABEL: func.func @basic
// CHECK:      linalg.fill ins(%{{.*}} : f32) outs(%[[OUT:.*]] : memref<64xf32>)
// CHECK-NEXT: %[[A:.*]] = memref.alloc() : memref<64xf32>
// CHECK-NEXT: linalg.fill ins(%{{.*}} : f32) outs(%[[A]] : memref<64xf32>)
// CHECK-NEXT: linalg.copy ins(%[[A]] : memref<64xf32>) outs(%[[OUT]] : memref<64xf32>)
// CHECK-NEXT: memref.dealloc %[[A]] : memref<64xf32>
// CHECK-NEXT: linalg.fill
// CHECK-NEXT: return
func.func @basic(%out: memref<64xf32>, %c: f32) {
  %a = memref.alloc() : memref<64xf32>
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  linalg.fill ins(%c : f32) outs(%a : memref<64xf32>)
  linalg.copy ins(%a : memref<64xf32>) outs(%out : memref<64xf32>)
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  memref.dealloc %a : memref<64xf32>
  return
}

// -----

// A view of the buffer keeps it: the dealloc follows the view's last use.
// CHECK-LABEL: func.func @view
// CHECK:      memref.collapse_shape
// CHECK:      linalg.copy ins(%{{.*}} : memref<64xf32>)
// CHECK-NEXT: memref.dealloc
// CHECK-NEXT: linalg.fill
func.func @view(%out: memref<64xf32>, %c: f32) {
  %a = memref.alloc() : memref<8x8xf32>
  linalg.fill ins(%c : f32) outs(%a : memref<8x8xf32>)
  %v = memref.collapse_shape %a [[0, 1]] : memref<8x8xf32> into memref<64xf32>
  linalg.copy ins(%v : memref<64xf32>) outs(%out : memref<64xf32>)
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  memref.dealloc %a : memref<8x8xf32>
  return
}

// -----

// The buffer's address reaches a descriptor and a launch through integer
// ops and calls: the dealloc follows the launch, not the pointer's read.
// CHECK-LABEL: func.func @pointer
// CHECK:      call @describe
// CHECK-NEXT: linalg.fill
// CHECK-NEXT: call @launch
// CHECK-NEXT: memref.dealloc
// CHECK-NEXT: linalg.fill
func.func private @describe(i64) -> i64
func.func private @launch(i64)
func.func @pointer(%out: memref<64xf32>, %c: f32) {
  %a = memref.alloc() : memref<64xf32>
  %p = memref.extract_aligned_pointer_as_index %a : memref<64xf32> -> index
  %i = arith.index_cast %p : index to i64
  %d = call @describe(%i) : (i64) -> i64
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  call @launch(%d) : (i64) -> ()
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  memref.dealloc %a : memref<64xf32>
  return
}

// -----

// A use inside a loop counts as the loop's. An element loaded from the
// buffer keeps it until the loaded value's last use: the GPU lowering moves
// a load of a row count into the kernels whose bounds use it.
// CHECK-LABEL: func.func @nested_and_loaded
// CHECK:      memref.load
// CHECK:      scf.for
// CHECK:        memref.store
// CHECK:      }
// CHECK-NEXT: memref.store
// CHECK-NEXT: memref.dealloc
// CHECK-NEXT: linalg.fill
// CHECK-NEXT: return
func.func @nested_and_loaded(%out: memref<64xf32>, %c: f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %a = memref.alloc() : memref<64xf32>
  linalg.fill ins(%c : f32) outs(%a : memref<64xf32>)
  %x = memref.load %a[%c0] : memref<64xf32>
  scf.for %i = %c0 to %c64 step %c1 {
    %y = memref.load %out[%i] : memref<64xf32>
    memref.store %y, %a[%i] : memref<64xf32>
  }
  memref.store %x, %out[%c0] : memref<64xf32>
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  memref.dealloc %a : memref<64xf32>
  return
}

// -----

// A buffer freed through its base buffer (as deallocation writes for a
// view) is the allocation's.
// CHECK-LABEL: func.func @base_buffer
// CHECK:      linalg.copy
// CHECK-NEXT: %[[BASE:[^,]*]], %{{.*}} = memref.extract_strided_metadata
// CHECK-NEXT: memref.dealloc %[[BASE]]
// CHECK-NEXT: linalg.fill
func.func @base_buffer(%out: memref<64xf32>, %c: f32) {
  %a = memref.alloc() : memref<128xf32>
  %v = memref.subview %a[64] [64] [1] : memref<128xf32> to memref<64xf32, strided<[1], offset: 64>>
  linalg.fill ins(%c : f32) outs(%a : memref<128xf32>)
  linalg.copy ins(%v : memref<64xf32, strided<[1], offset: 64>>) outs(%out : memref<64xf32>)
  %base, %offset, %size, %stride = memref.extract_strided_metadata %v : memref<64xf32, strided<[1], offset: 64>> -> memref<f32>, index, index, index
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  memref.dealloc %base : memref<f32>
  return
}

// -----

// Left alone: a dealloc in another block than the allocation, and a buffer
// that a region yields to the caller's block.
// CHECK-LABEL: func.func @other_block
// CHECK:      %[[A:.*]] = memref.alloc
// CHECK-NEXT: linalg.fill
// CHECK:      scf.if
// CHECK-NEXT:   linalg.fill
// CHECK-NEXT:   memref.dealloc %[[A]]
func.func @other_block(%out: memref<64xf32>, %c: f32, %cond: i1) {
  %a = memref.alloc() : memref<64xf32>
  linalg.fill ins(%c : f32) outs(%a : memref<64xf32>)
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  scf.if %cond {
    linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
    memref.dealloc %a : memref<64xf32>
  }
  return
}

// CHECK-LABEL: func.func @yielded
// CHECK:      %[[R:.*]] = scf.if
// CHECK:      linalg.copy ins(%[[R]]
// CHECK-NEXT: memref.dealloc
// CHECK-NEXT: return
func.func @yielded(%out: memref<64xf32>, %c: f32, %cond: i1) {
  %a = memref.alloc() : memref<64xf32>
  linalg.fill ins(%c : f32) outs(%a : memref<64xf32>)
  %r = scf.if %cond -> memref<64xf32> {
    scf.yield %a : memref<64xf32>
  } else {
    scf.yield %out : memref<64xf32>
  }
  linalg.copy ins(%r : memref<64xf32>) outs(%out : memref<64xf32>)
  memref.dealloc %a : memref<64xf32>
  return
}

// -----

// A buffer nothing uses is freed right after it is allocated.
// CHECK-LABEL: func.func @unused
// CHECK:      memref.alloc
// CHECK-NEXT: memref.dealloc
// CHECK-NEXT: linalg.fill
func.func @unused(%out: memref<64xf32>, %c: f32) {
  %a = memref.alloc() : memref<64xf32>
  linalg.fill ins(%c : f32) outs(%out : memref<64xf32>)
  memref.dealloc %a : memref<64xf32>
  return
}
