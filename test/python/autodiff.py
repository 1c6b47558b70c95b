# RUN: %python %s
#
# -moe-autodiff against finite differences, op by op, for an MoE layer and
# for a whole small language model (moe_mlir.models).
# Every case is a loss function (the op's output projected on a fixed random
# vector, or the op's own loss); the pass adds @loss_grad, both are compiled
# for the CPU, and for each differentiated argument the gradient's
# directional derivative <grad, v> along two random directions v is compared
# with the central difference (f(x + eps v) - f(x - eps v)) / 2 eps of the
# compiled loss. f32 throughout: eps = 1e-3 gives differences good to about
# 1e-3 of the derivative's scale, so the bound is 1e-2 relative plus 1e-3 of
# the loss's scale. Arguments the loss does not reach get zero gradients,
# and ops without a rule are refused with a located error.
import os
import re
import sys
import tempfile

import numpy as np

import moe_mlir
from moe_mlir import MLIRError
from checks import check, finish



def ttype(shape, elt="f32"):
    return "tensor<" + "".join(f"{d}x" for d in shape) + elt + ">"


def loss_function(args, body, out, out_shape):
    """args: [(name, shape, elt, differentiable)]; body computes %<out> of
    out_shape (or a 0-d loss when out_shape is ())."""
    params = []
    for name, shape, elt, grad in args:
        attr = "" if grad or elt != "f32" else " {moe.no_grad}"
        params.append(f"%{name}: {ttype(shape, elt)}{attr}")
    if out_shape == ():
        tail, extra = f"  return %{out} : tensor<f32>\n", []
    else:
        n = int(np.prod(out_shape))
        extra = [("proj", (n, 1), "f32", False)]
        params.append(f"%proj: {ttype((n, 1))} {{moe.no_grad}}")
        r = len(out_shape)
        flat = f"%{out}"
        tail = ""
        if r > 1:
            groups = ", ".join(str(i) for i in range(r))
            tail += (f"  %flat = tensor.collapse_shape %{out} [[{groups}]] : "
                     f"{ttype(out_shape)} into {ttype((n,))}\n")
            flat = "%flat"
        tail += f"""  %row = tensor.expand_shape {flat} [[0, 1]] output_shape [1, {n}] : {ttype((n,))} into {ttype((1, n))}
  %zero_ = arith.constant 0.0 : f32
  %e_ = tensor.empty() : tensor<1x1xf32>
  %z_ = linalg.fill ins(%zero_ : f32) outs(%e_ : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m_ = linalg.matmul ins(%row, %proj : {ttype((1, n))}, {ttype((n, 1))}) outs(%z_ : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l_ = tensor.collapse_shape %m_ [] : tensor<1x1xf32> into tensor<f32>
  return %l_ : tensor<f32>
"""
    text = (f"func.func @loss({', '.join(params)}) -> tensor<f32> {{\n"
            f"{body}\n{tail}}}\n")
    return text, args + extra


def compile_loss(text, tmp, tag):
    m = moe_mlir.Module.parse(text)
    m.run("builtin.module(moe-autodiff)")
    so = os.path.join(tmp, f"{tag}.so")
    m.compile("cpu", so)
    return moe_mlir.load(so), str(m)


def gradient_check(tag, args, body, out, out_shape, tmp, rng, values=None,
                   eps=1e-3, prelude=""):
    text, all_args = loss_function(args, body, out, out_shape)
    text = prelude + text
    try:
        art, ir = compile_loss(text, tmp, tag)
    except MLIRError as err:
        check(False, f"{tag}: compiles ({str(err).splitlines()[-1]})")
        return None
    inputs = []
    for name, shape, elt, grad in all_args:
        if values and name in values:
            inputs.append(values[name])
        elif elt == "f32":
            inputs.append(rng.standard_normal(shape).astype(np.float32))
        else:
            raise ValueError(f"{tag}: no value for integer argument {name}")
    saved = [a.copy() for a in inputs]
    results = art.loss_grad(*inputs)
    loss, grads = results[0], results[1:]
    forward = art.loss(*inputs)
    check(all(np.array_equal(a, b) for a, b in zip(inputs, saved)),
          f"{tag}: the compiled functions leave their arguments unchanged")
    check(np.array_equal(loss, forward),
          f"{tag}: the train step's loss is the forward loss ({float(loss):.5f})")
    wrt = [i for i, (n, s, e, g) in enumerate(all_args) if e == "f32" and g]
    check(len(grads) == len(wrt), f"{tag}: one gradient per differentiable argument")
    scale = abs(float(loss)) + 1.0
    for gi, ai in enumerate(wrt):
        name = all_args[ai][0]
        g = grads[gi]
        worst = 0.0
        for _ in range(2):
            v = rng.standard_normal(inputs[ai].shape).astype(np.float32)
            plus = list(inputs); minus = list(inputs)
            plus[ai] = (inputs[ai] + eps * v).astype(np.float32)
            minus[ai] = (inputs[ai] - eps * v).astype(np.float32)
            fd = (float(art.loss(*plus)) - float(art.loss(*minus))) / (2 * eps)
            an = float(np.sum(g.astype(np.float64) * v))
            err = abs(fd - an) / (1e-2 * max(abs(an), abs(fd)) + 1e-3 * scale)
            worst = max(worst, err)
        check(worst <= 1.0, f"{tag}: d/d{name} matches finite differences "
                            f"(worst error {worst:.2f} of the bound)")
    return art, ir, inputs, grads


with tempfile.TemporaryDirectory() as tmp:
    rng = np.random.default_rng(7)

    # --- model ops ---
    gradient_check("rms_norm", [("x", (2, 3, 16), "f32", True), ("w", (16,), "f32", True)],
                   "  %y = moe.rms_norm %x, %w eps(1.0e-6) : tensor<2x3x16xf32>, tensor<16xf32> -> tensor<2x3x16xf32>",
                   "y", (2, 3, 16), tmp, rng)
    gradient_check("rotary", [("x", (2, 5, 2, 8), "f32", True)],
                   "  %y = moe.rotary %x theta(10000.0) : tensor<2x5x2x8xf32> -> tensor<2x5x2x8xf32>",
                   "y", (2, 5, 2, 8), tmp, rng)
    q, kv = (2, 5, 4, 8), (2, 5, 2, 8)
    for causal in ("causal", "scale(0.5)"):
        gradient_check(f"attention {causal}",
                       [("q", q, "f32", True), ("k", kv, "f32", True), ("v", kv, "f32", True)],
                       f"  %y = moe.attention %q, %k, %v {causal} : {ttype(q)}, {ttype(kv)}, {ttype(kv)} -> {ttype(q)}",
                       "y", q, tmp, rng)
    # Packed rows: keys of other documents hidden (ids need not be sorted).
    docs = np.array([[0, 0, 1, 1, 1], [4, 2, 2, 4, 2]], dtype=np.int32)
    for causal in ("causal ", ""):
        gradient_check(f"attention {causal}documents",
                       [("q", q, "f32", True), ("k", kv, "f32", True), ("v", kv, "f32", True),
                        ("docs", (2, 5), "i32", False)],
                       f"  %y = moe.attention %q, %k, %v {causal}documents(%docs : tensor<2x5xi32>) "
                       f": {ttype(q)}, {ttype(kv)}, {ttype(kv)} -> {ttype(q)}",
                       "y", q, tmp, rng, values={"docs": docs})
    # ... and the forward against a reference of that definition.
    m = moe_mlir.Module.parse(
        f"func.func @attn(%q: {ttype(q)}, %k: {ttype(kv)}, %v: {ttype(kv)}, "
        f"%docs: tensor<2x5xi64>) -> {ttype(q)} {{\n"
        f"  %y = moe.attention %q, %k, %v causal documents(%docs : tensor<2x5xi64>) "
        f": {ttype(q)}, {ttype(kv)}, {ttype(kv)} -> {ttype(q)}\n"
        f"  return %y : {ttype(q)}\n}}\n")
    m.compile("cpu", os.path.join(tmp, "attn.so"))
    attn = moe_mlir.load(os.path.join(tmp, "attn.so"))
    qa, ka, va = (rng.standard_normal(s).astype(np.float32) for s in (q, kv, kv))
    got = attn.attn(qa, ka, va, docs.astype(np.int64))
    want = np.zeros(q, dtype=np.float64)
    group = q[2] // kv[2]
    for b in range(q[0]):
        for n in range(q[2]):
            s = qa[b, :, n].astype(np.float64) @ ka[b, :, n // group].T.astype(np.float64)
            s /= np.sqrt(q[3])
            i, j = np.indices(s.shape)
            s[(j > i) | (docs[b][:, None] != docs[b][None, :])] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            want[b, :, n] = p @ va[b, :, n // group]
    err = np.abs(got - want).max()
    check(err < 1e-5, f"attention with documents matches the masked reference "
                      f"(max error {err:.2e})")
    ids = np.array([[0, 3, 3, 10, -1], [11, 2, 0, 7, 3]], dtype=np.int32)
    gradient_check("embedding", [("t", (11, 8), "f32", True), ("ids", (2, 5), "i32", False)],
                   "  %y = moe.embedding %t, %ids : tensor<11x8xf32>, tensor<2x5xi32> -> tensor<2x5x8xf32>",
                   "y", (2, 5, 8), tmp, rng, values={"ids": ids})
    labels = np.array([1, 9, -100, 0, 4, 4], dtype=np.int32)
    gradient_check("cross_entropy", [("lg", (6, 10), "f32", True), ("lab", (6,), "i32", False)],
                   "  %y = moe.cross_entropy %lg, %lab : tensor<6x10xf32>, tensor<6xi32> -> tensor<f32>",
                   "y", (), tmp, rng, values={"lab": labels})

    # --- upstream ops ---
    gradient_check("matmul+transpose+softmax", [("a", (4, 6), "f32", True), ("b", (5, 6), "f32", True)],
                   """  %e = tensor.empty() : tensor<6x5xf32>
  %bt = linalg.transpose ins(%b : tensor<5x6xf32>) outs(%e : tensor<6x5xf32>) permutation = [1, 0]
  %c0 = arith.constant 0.0 : f32
  %e2 = tensor.empty() : tensor<4x5xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e2 : tensor<4x5xf32>) -> tensor<4x5xf32>
  %m = linalg.matmul ins(%a, %bt : tensor<4x6xf32>, tensor<6x5xf32>) outs(%z : tensor<4x5xf32>) -> tensor<4x5xf32>
  %s = linalg.softmax dimension(1) ins(%m : tensor<4x5xf32>) outs(%e2 : tensor<4x5xf32>) -> tensor<4x5xf32>""",
                   "s", (4, 5), tmp, rng)
    gradient_check("elementwise", [("a", (3, 4), "f32", True), ("b", (3, 4), "f32", True)],
                   """  %s = arith.addf %a, %b : tensor<3x4xf32>
  %d = arith.subf %s, %b : tensor<3x4xf32>
  %p = arith.mulf %d, %a : tensor<3x4xf32>
  %x = math.exp %b : tensor<3x4xf32>
  %q = arith.divf %p, %x : tensor<3x4xf32>
  %n = arith.negf %q : tensor<3x4xf32>
  %t = math.tanh %n : tensor<3x4xf32>""",
                   "t", (3, 4), tmp, rng)
    # Slices (the chunks of -moe-expert-parallel{chunks}): rows taken out,
    # scaled, and put back over part of another tensor (whose overwritten
    # part gets no gradient).
    gradient_check("extract_slice+insert_slice", [("a", (6, 4), "f32", True), ("b", (6, 4), "f32", True)],
                   """  %top = tensor.extract_slice %a[0, 0] [3, 4] [1, 1] : tensor<6x4xf32> to tensor<3x4xf32>
  %col = tensor.extract_slice %a[1, 2] [4, 1] [1, 1] : tensor<6x4xf32> to tensor<4xf32>
  %sq = arith.mulf %top, %top : tensor<3x4xf32>
  %put = tensor.insert_slice %sq into %b[2, 0] [3, 4] [1, 1] : tensor<3x4xf32> into tensor<6x4xf32>
  %two = tensor.insert_slice %col into %put[1, 1] [4, 1] [1, 1] : tensor<4xf32> into tensor<6x4xf32>
  %y = arith.mulf %two, %b : tensor<6x4xf32>""",
                   "y", (6, 4), tmp, np.random.default_rng(11))

    # --- the MoE layer: router, dispatch, experts, combine ---
    T, H, F, E, K = 8, 16, 8, 4, 2
    for router, variant in (("softmax norm_topk_prob", "unfused"), ("softmax", "unfused"),
                            ("softmax softmax_after_topk", "unfused"),
                            ("sigmoid norm_topk_prob", "unfused"),
                            ("softmax norm_topk_prob", "fused")):
        R = T * K
        if variant == "unfused":
            experts = f"""  %h = moe.grouped_matmul %s, %w1, %o : tensor<{R}x{H}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{2*F}xf32>
  %a = moe.swiglu %h : tensor<{R}x{2*F}xf32> -> tensor<{R}x{F}xf32>
  %ye = moe.grouped_matmul %a, %w2, %o : tensor<{R}x{F}xf32>, tensor<{E}x{F}x{H}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{H}xf32>"""
        else:
            experts = f"""  %ye = moe.grouped_mlp %s, %w1, %w2, %o : tensor<{R}x{H}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{H}xf32>"""
        body = f"""  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{T}x{E}xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
  %logits = linalg.matmul ins(%x, %rw : tensor<{T}x{H}xf32>, tensor<{H}x{E}xf32>) outs(%z : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
  %idx, %w = moe.router %logits top_k({K}) {router} : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts({E}) : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32> -> tensor<{R}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
{experts}
  %y = moe.combine %ye, %w, %p : tensor<{R}x{H}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{H}xf32>"""
        gradient_check(f"moe layer ({router}, {variant})",
                       [("x", (T, H), "f32", True), ("rw", (H, E), "f32", True),
                        ("w1", (E, H, 2 * F), "f32", True), ("w2", (E, F, H), "f32", True)],
                       body, "y", (T, H), tmp, rng)

    # --- calls: a function called twice (one weight shared by both calls),
    # differentiated once into a forward and a backward; one of its two
    # results unused at the first call (a zero cotangent) ---
    layer = """func.func private @layer(%x: tensor<4x6xf32>, %w: tensor<6x6xf32>) -> (tensor<4x6xf32>, tensor<4x6xf32>) {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x6xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<4x6xf32>) -> tensor<4x6xf32>
  %m = linalg.matmul ins(%x, %w : tensor<4x6xf32>, tensor<6x6xf32>) outs(%z : tensor<4x6xf32>) -> tensor<4x6xf32>
  %t = math.tanh %m : tensor<4x6xf32>
  %y = arith.addf %t, %x : tensor<4x6xf32>
  %sq = arith.mulf %x, %t : tensor<4x6xf32>
  return %y, %sq : tensor<4x6xf32>, tensor<4x6xf32>
}
"""
    res = gradient_check(
        "calls", [("x", (4, 6), "f32", True), ("w", (6, 6), "f32", True),
                  ("u", (6, 6), "f32", True)],
        """  %a:2 = func.call @layer(%x, %w) {no_inline} : (tensor<4x6xf32>, tensor<6x6xf32>) -> (tensor<4x6xf32>, tensor<4x6xf32>)
  %b:2 = func.call @layer(%a#0, %u) {no_inline} : (tensor<4x6xf32>, tensor<6x6xf32>) -> (tensor<4x6xf32>, tensor<4x6xf32>)
  %c:2 = func.call @layer(%b#1, %w) : (tensor<4x6xf32>, tensor<6x6xf32>) -> (tensor<4x6xf32>, tensor<4x6xf32>)
  %y = arith.addf %c#0, %b#0 : tensor<4x6xf32>""", "y", (4, 6), tmp,
        np.random.default_rng(11), prelude=layer)
    if res:
        ir = res[1]
        defs = re.findall(r"llvm\.func (?:private )?@(layer\w*)\(", ir)
        check(sorted(defs) == ["layer", "layer_backward", "layer_forward"] and
              ir.count("llvm.call @layer_backward(") == 3,
              "calls: the function is split once, its backward called per call")

    # --- a whole small model (moe_mlir.models): a dense and an MoE layer with a
    # shared expert, tied embeddings; every parameter tensor along 2 directions ---
    from moe_mlir.models import LanguageModel
    cfg = {"hidden_size": 16, "intermediate_size": 24, "moe_intermediate_size": 8,
           "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
           "vocab_size": 13, "mlp_only_layers": [0], "shared_expert_intermediate_size": 8,
           "tie_word_embeddings": True, "rope_theta": 100.0}
    model = LanguageModel(cfg, batch=2, seq=6, workdir=tmp)
    params = {k: (v if k.endswith("norm.weight") else v * 10).astype(np.float32)
              for k, v in model.init(seed=3).items()}
    ids = rng.integers(0, 13, (2, 6)).astype(np.int32)
    labels = LanguageModel.next_token_labels(ids)
    loss, grads = model.loss_grad(params, ids, labels)
    worst = (0.0, "")
    for name in model.names:
        for _ in range(2):
            v = rng.standard_normal(params[name].shape).astype(np.float32)
            plus, minus = dict(params), dict(params)
            plus[name] = params[name] + 1e-3 * v
            minus[name] = params[name] - 1e-3 * v
            fd = (model.loss(plus, ids, labels) - model.loss(minus, ids, labels)) / 2e-3
            an = float(np.sum(grads[name].astype(np.float64) * v))
            err = abs(fd - an) / (1e-2 * max(abs(an), abs(fd)) + 1e-3 * (abs(loss) + 1))
            worst = max(worst, (err, name))
    check(worst[0] <= 1.0, f"whole model: all {len(model.names)} parameter gradients match finite "
                           f"differences (worst {worst[0]:.2f} of the bound, {worst[1]})")

    # --- arguments the loss does not reach; refused ops ---
    res = gradient_check("unused argument", [("a", (2, 3), "f32", True), ("b", (3,), "f32", True)],
                         "  %y = arith.mulf %a, %a : tensor<2x3xf32>", "y", (2, 3), tmp, rng)
    if res:
        check(not np.any(res[3][1]), "an argument the loss does not use gets a zero gradient")
    text, _ = loss_function([("a", (2, 3), "f32", True)], """  %e = tensor.empty() : tensor<2x3xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%a : tensor<2x3xf32>) outs(%e : tensor<2x3xf32>) {
  ^bb0(%v: f32, %o: f32):
    %sq = arith.mulf %v, %v : f32
    linalg.yield %sq : f32
  } -> tensor<2x3xf32>""", "y", (2, 3))
    try:
        m = moe_mlir.Module.parse(text)
        m.run("builtin.module(moe-autodiff)")
        check(False, "a linalg.generic on the loss's path is refused")
    except MLIRError as err:
        check("no gradient rule" in str(err) and "loc(" in str(err),
              "a linalg.generic on the loss's path is refused, located")
    try:
        moe_mlir.Module.parse("func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> { return %a : tensor<2xf32> }").run(
            "builtin.module(moe-autodiff{functions=f})")
        check(False, "a function that returns no loss is refused")
    except MLIRError as err:
        check("expects a loss function" in str(err), "a function that returns no loss is refused")

finish()
