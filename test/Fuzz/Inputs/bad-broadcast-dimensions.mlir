func.func @f(%d: tensor<3xf32>, %e: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %t = linalg.broadcast ins(%d : tensor<3xf32>) outs(%e : tensor<2x3xf32>) dimensions = empty()
  return %t : tensor<2x3xf32>
}
