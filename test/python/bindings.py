# RUN: %python %s
#
# The Python package end to end: parse, print, errors as MLIRError with the
# location, pass pipelines, compile to a shared object, call it with numpy,
# and the MoE layer of moe_mlir.layers against an independent numpy
# implementation of the Qwen3-MoE sparse block (f32: routing identical,
# outputs within a few f32 ulps of the sums; MXFP8: the tokens, both weights
# and the SwiGLU activation are each rounded to E4M3, 3 mantissa bits, about
# 2^-5 relative error per tensor on average: measured ~0.06 for the layer,
# bounded here by 2^-3).
import json
import os
import sys
import tempfile

import numpy as np

import moe_mlir
from moe_mlir import MLIRError, layers
from checks import check, finish



def expect_error(fn, *fragments):
    try:
        fn()
    except (MLIRError, ValueError, TypeError) as err:
        text = str(err)
        return all(f in text for f in fragments), text
    return False, "no error"


# --- parse, print, errors ---
m = moe_mlir.Module.parse(layers.moe_layer(tokens=8, hidden=32, ffn=32, experts=4, top_k=2))
check("moe.router" in str(m) and "moe.grouped_mlp" in str(m), "parse and print a layer")
ok, text = expect_error(lambda: moe_mlir.Module.parse("func.func @f( {"), "cannot parse", "error:")
check(ok, f"malformed text raises MLIRError with the diagnostic ({text.splitlines()[-1]})")
ok, text = expect_error(lambda: moe_mlir.Module.parse(
    "func.func @f(%x: tensor<4x3xf32>) -> tensor<4x1xf32> {\n"
    "  %a = moe.swiglu %x : tensor<4x3xf32> -> tensor<4x1xf32>\n"
    "  return %a : tensor<4x1xf32>\n}"), "loc(", "even")
check(ok, "a verifier error carries its location")
ok, text = expect_error(lambda: m.run("builtin.module(no-such-pass)"), "no-such-pass")
check(ok, "an unknown pass is an MLIRError")

# --- pipelines ---
m.run("builtin.module(moe-train-pipeline{ep-size=2 recipe=mxfp8})")
check("moe.all_to_all" in str(m) and "f8E4M3FN" in str(m), "the training pipeline from Python")

# --- layers from a config.json, with its errors ---
with tempfile.TemporaryDirectory() as tmp:
    cfg = {"hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 8,
           "num_experts_per_tok": 2, "norm_topk_prob": True, "vocab_size": 25}
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    text = layers.from_config(path, tokens=16)
    check("top_k(2)" in text and "experts(8)" in text, "from_config reads a config.json")
    bad = dict(cfg)
    del bad["num_experts"]
    ok, msg = expect_error(lambda: layers.from_config(bad, tokens=16), "num_experts")
    check(ok, f"a config without num_experts names the field ({msg})")
    ok, msg = expect_error(lambda: layers.from_config(dict(cfg, num_experts_per_tok=9), tokens=16),
                           "num_experts_per_tok")
    check(ok, "top-k above the expert count is refused")
    ok, msg = expect_error(lambda: layers.from_config(dict(cfg, hidden_size="64"), tokens=16),
                           "hidden_size")
    check(ok, "a non-integer field is refused")

    # --- compile, load, call with numpy ---
    T, H, F, E, K = 48, 64, 32, 8, 2
    so = os.path.join(tmp, "layer.so")
    moe_mlir.Module.parse(layers.moe_layer(T, H, F, E, K)).compile("cpu", so)
    art = moe_mlir.load(so)
    check(list(art.functions) == ["moe_layer"], "the artifact's manifest lists the function")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, H)).astype(np.float32)
    rw = rng.standard_normal((H, E)).astype(np.float32)
    w1 = (rng.standard_normal((E, H, 2 * F)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((E, F, H)) * 0.1).astype(np.float32)
    y = art.moe_layer(x, rw, w1, w2)

    # Independent numpy reference of the Qwen3-MoE sparse block.
    def reference(x, rw, w1, w2):
        logits = x.astype(np.float64) @ rw
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        top = np.argsort(-p, axis=1, kind="stable")[:, :K]
        wt = np.take_along_axis(p, top, 1)
        wt /= wt.sum(1, keepdims=True)
        out = np.zeros((T, H))
        for t in range(T):
            for j in range(K):
                e = top[t, j]
                h = x[t] @ w1[e]
                g, u = h[:F], h[F:]
                out[t] += wt[t, j] * ((g / (1 + np.exp(-g)) * u) @ w2[e])
        return out

    ref = reference(x, rw, w1, w2)
    err = np.abs(y - ref).max() / np.abs(ref).max()
    check(y.shape == (T, H) and err < 1e-5, f"f32 layer matches numpy (max rel error {err:.2e})")

    so8 = os.path.join(tmp, "layer8.so")
    moe_mlir.Module.parse(layers.moe_layer(T, H, F, E, K, recipe="mxfp8")).compile("cpu", so8)
    y8 = moe_mlir.load(so8).moe_layer(x, rw, w1, w2)
    rel = np.linalg.norm(y8 - ref) / np.linalg.norm(ref)
    check(0.005 < rel < 2 ** -3,
          f"MXFP8 layer within E4M3's rounding of numpy (rel error {rel:.3f})")

    # Groups padded to 32 rows (what an MXFP8 recipe wants): the padding rows
    # are zeros that no token reads back, so the f32 layer is unchanged.
    sop = os.path.join(tmp, "layer_pad.so")
    padded = layers.moe_layer(T, H, F, E, K, pad_to=32)
    check("pad_to(32)" in padded, "pad_to reaches the dispatch")
    moe_mlir.Module.parse(padded).compile("cpu", sop)
    yp = moe_mlir.load(sop).moe_layer(x, rw, w1, w2)
    check(np.abs(yp - y).max() <= 1e-6 * np.abs(y).max(),
          "padding each group to 32 rows leaves the f32 layer's result as it is")
    # GPU options in the GPU pipeline's syntax: checked (names and values)
    # before the module is touched, for GPU targets only.
    ok, msg = expect_error(
        lambda: moe_mlir.Module.parse(padded).compile(
            "sm_90a", sop, gpu_options="pair-round-trips=sometimes"),
        "bad GPU options", "pair-round-trips=sometimes")
    check(ok, f"an unknown GPU option value is refused ({msg})")
    ok, msg = expect_error(
        lambda: moe_mlir.Module.parse(padded).compile("cpu", sop, gpu_options="mx-activations=always"),
        "given for target cpu")
    check(ok, f"GPU options for the CPU are refused ({msg})")
    ok, msg = expect_error(lambda: layers.moe_layer(T, H, F, E, K, pad_to=0), "pad_to")
    check(ok, f"a pad_to below 1 is refused ({msg})")
    ok, msg = expect_error(lambda: layers.moe_layer(T, H, F, E, K, recipe="mxfp8", pad_to=16),
                           "pad_to", "32")
    check(ok, f"mxfp8 with groups not padded to 32 is refused ({msg})")

    ok, msg = expect_error(lambda: art.moe_layer(x[:, :10], rw, w1, w2), "argument #0", "64")
    check(ok, f"a wrong shape is refused naming the argument ({msg})")
    ok, msg = expect_error(lambda: art.moe_layer(x.astype(np.float64), rw, w1, w2), "argument #0")
    check(ok, "a wrong dtype is refused")

    # Dynamic dimensions the program needs equal (once unchecked: a call
    # with inconsistent sizes read outside the arrays and could crash the
    # interpreter), and one tied to a static size.
    dyn = os.path.join(tmp, "dyn.so")
    moe_mlir.Module.parse("""
func.func @add(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %a, %c0 : tensor<?x?xf32>
  %d1 = tensor.dim %a, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %r = linalg.add ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>)
                  outs(%e : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
func.func @rows(%x: tensor<?x64xf32>, %w: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %c0 = arith.constant 0 : index
  %d0 = tensor.dim %x, %c0 : tensor<?x64xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty(%d0) : tensor<?x8xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x8xf32>) -> tensor<?x8xf32>
  %r = linalg.matmul ins(%x, %w : tensor<?x64xf32>, tensor<?x8xf32>)
                     outs(%f : tensor<?x8xf32>) -> tensor<?x8xf32>
  return %r : tensor<?x8xf32>
}""").compile("cpu", dyn)
    art_dyn = moe_mlir.load(dyn)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    check(np.array_equal(art_dyn.add(a, 2 * a), 3 * a), "dynamic sizes that agree are computed")
    ok, msg = expect_error(lambda: art_dyn.add(np.ones((400, 500), np.float32),
                                               np.ones((1, 1), np.float32)),
                           "must be equal", "argument #0 dim 0 is 400", "argument #1 dim 0 is 1")
    check(ok, f"dynamic sizes that disagree are refused naming them ({msg})")
    ok, msg = expect_error(lambda: art_dyn.add(a, a[:, :6].copy()), "argument #1 dim 1 is 6")
    check(ok, "either dimension")
    xr = rng.standard_normal((3, 64)).astype(np.float32)
    wr = rng.standard_normal((64, 8)).astype(np.float32)
    check(np.allclose(art_dyn.rows(xr, wr), xr @ wr, atol=1e-5), "a dynamic dimension tied to 64")
    ok, msg = expect_error(lambda: art_dyn.rows(xr, wr[:60].copy()), "must be 64",
                           "argument #1 dim 0 is 60")
    check(ok, f"a dynamic dimension tied to a static size is checked ({msg})")
    ok, msg = expect_error(lambda: art.moe_layer(x), "takes 4 arrays")
    check(ok, "a wrong argument count is refused")

finish()
