func.func @f(%a: tensor<2x3xf32>, %c: tensor<2xf32>) -> tensor<2xf32> {
  %s = linalg.reduce ins(%a : tensor<2x3xf32>) outs(%c : tensor<2xf32>) dimensions = [x]
    (%x: f32, %y: f32) {
      %z = arith.addf %x, %y : f32
      linalg.yield %z : f32
    }
  return %s : tensor<2xf32>
}
