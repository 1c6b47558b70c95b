// RUN: moe-opt %s -moe-read-inserted-slices | FileCheck %s

// A read of %part after it went into %whole reads it back from %whole; the
// insertion itself and reads before it keep %part.
// CHECK-LABEL: func.func @read_after_insert
// CHECK: %[[BEFORE:.*]] = arith.addf %[[PART:.*]], %[[PART]]
// CHECK: %[[WHOLE:.*]] = tensor.insert_slice %[[PART]] into
// CHECK: %[[BACK0:.*]] = tensor.extract_slice %[[WHOLE]][2] [4] [1]
// CHECK: %[[BACK1:.*]] = tensor.extract_slice %[[WHOLE]][2] [4] [1]
// CHECK: arith.mulf %[[BACK1]], %[[BACK0]]
func.func @read_after_insert(%part: tensor<4xf32>, %dest: tensor<8xf32>)
    -> (tensor<4xf32>, tensor<8xf32>, tensor<4xf32>) {
  %before = arith.addf %part, %part : tensor<4xf32>
  %whole = tensor.insert_slice %part into %dest[2] [4] [1]
      : tensor<4xf32> into tensor<8xf32>
  %after = arith.mulf %part, %part : tensor<4xf32>
  return %before, %whole, %after : tensor<4xf32>, tensor<8xf32>, tensor<4xf32>
}

// An op writing into %part (its destination) keeps %part: writing into a
// view of the whole would make bufferization copy all of it.
// CHECK-LABEL: func.func @write_after_insert
// CHECK: tensor.insert_slice
// CHECK-NOT: tensor.extract_slice
// CHECK: linalg.fill ins(%{{.*}} : f32) outs(%arg0 : tensor<4xf32>)
func.func @write_after_insert(%part: tensor<4xf32>, %dest: tensor<8xf32>, %v: f32)
    -> (tensor<8xf32>, tensor<4xf32>) {
  %whole = tensor.insert_slice %part into %dest[0] [4] [1]
      : tensor<4xf32> into tensor<8xf32>
  %filled = linalg.fill ins(%v : f32) outs(%part : tensor<4xf32>) -> tensor<4xf32>
  return %whole, %filled : tensor<8xf32>, tensor<4xf32>
}
