// Well-formed arrays, the generic form and strings pass the check.
func.func @f(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>, %c: tensor<2xf32>, %d: tensor<3xf32>, %e: tensor<2x3xf32>)
    -> (tensor<3x2xf32>, tensor<2xf32>, tensor<2x3xf32>, tensor<3x2xf32>) attributes {note = "linalg.transpose permutation = empty()"} {
  %r = linalg.transpose ins(%a : tensor<2x3xf32>) outs(%b : tensor<3x2xf32>) permutation = [1, 0]
  %s = linalg.reduce ins(%a : tensor<2x3xf32>) outs(%c : tensor<2xf32>) dimensions = [1]
    (%x: f32, %y: f32) {
      %z = arith.addf %x, %y : f32
      linalg.yield %z : f32
    }
  %t = linalg.broadcast ins(%d : tensor<3xf32>) outs(%e : tensor<2x3xf32>) dimensions = [0]
  %u = "linalg.transpose"(%a, %b) <{permutation = array<i64: 1, 0>}> ({
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  }) : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
  return %r, %s, %t, %u : tensor<3x2xf32>, tensor<2xf32>, tensor<2x3xf32>, tensor<3x2xf32>
}
