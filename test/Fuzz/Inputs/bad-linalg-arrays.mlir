// An integer out of range in a permutation (the upstream parser crashes).
func.func @f(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> tensor<3x2xf32> {
  %r = linalg.transpose ins(%a : tensor<2x3xf32>) outs(%b : tensor<3x2xf32>)
         permutation = [0, 99999999999999999999]
  return %r : tensor<3x2xf32>
}
