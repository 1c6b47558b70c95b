"""MoE layers as MLIR text, from arguments or a Hugging Face config.json.

    text = moe_mlir.layers.moe_layer(tokens=64, hidden=64, ffn=32, experts=8, top_k=2)
    text = moe_mlir.layers.from_config("config.json", tokens=1024)
    loss = moe_mlir.layers.as_loss(text, "moe_layer", rows=1024, cols=hidden)

The function ``@moe_layer(x [T, H], router_w [H, E], w1 [E, H, 2F],
w2 [E, F, H]) -> [T, H]`` computes, in f32: router logits ``x @ router_w``,
softmax top-k routing (``norm_topk_prob``), dispatch, the experts' SwiGLU
MLPs (gate and up split in w1's last dimension), and the weighted combine —
the sparse MoE block of Qwen3-MoE.
"""

import json

QWEN3_MOE_FIELDS = ("hidden_size", "moe_intermediate_size", "num_experts",
                    "num_experts_per_tok")


def moe_layer(tokens, hidden, ffn, experts, top_k, norm_topk_prob=True,
              recipe=None, name="moe_layer", pad_to=None):
    """MLIR for one MoE block. recipe=None keeps f32 experts, "mxfp8" quantizes
    the expert GEMMs (hidden and ffn must then be multiples of 32).

    pad_to: each expert's rows are padded to a multiple of it (the dispatch's
    pad_to; default 32 with a recipe, else 1). Pad to 32 for an f32 layer that
    a pipeline's MXFP8 recipe will quantize: the columnwise MX blocks then
    never mix two experts, and the fused backward rounds them in its GEMM
    epilogue."""
    for field, value in (("tokens", tokens), ("hidden", hidden), ("ffn", ffn),
                         ("experts", experts), ("top_k", top_k)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{field} must be a positive integer, got {value!r}")
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) cannot exceed experts ({experts})")
    if recipe not in (None, "mxfp8"):
        raise ValueError(f"recipe must be None or 'mxfp8', got {recipe!r}")
    if recipe == "mxfp8" and (hidden % 32 or ffn % 32):
        raise ValueError(f"mxfp8 needs hidden ({hidden}) and ffn ({ffn}) to be multiples of 32")
    T, H, F, E, K = tokens, hidden, ffn, experts, top_k
    pad = pad_to if pad_to is not None else (32 if recipe else 1)
    if not isinstance(pad, int) or pad < 1:
        raise ValueError(f"pad_to must be a positive integer, got {pad_to!r}")
    if recipe and pad % 32:
        raise ValueError(f"mxfp8 needs pad_to ({pad}) to be a multiple of 32")
    R = (T * K + E * (pad - 1)) // pad * pad
    norm = " norm_topk_prob" if norm_topk_prob else ""
    if recipe:
        w1t, w2t = (f"!moe.mx<{E}x{H}x{2*F}xf8E4M3FN, axis = 1>",
                    f"!moe.mx<{E}x{F}x{H}xf8E4M3FN, axis = 1>")
        prep = (f"  %xq = moe.quantize %s : tensor<{R}x{H}xf32> -> !moe.mx<{R}x{H}xf8E4M3FN, axis = 1>\n"
                f"  %w1q = moe.quantize %w1 : tensor<{E}x{H}x{2*F}xf32> -> {w1t}\n"
                f"  %w2q = moe.quantize %w2 : tensor<{E}x{F}x{H}xf32> -> {w2t}\n")
        xs, xt, a1, a2 = "%xq", f"!moe.mx<{R}x{H}xf8E4M3FN, axis = 1>", "%w1q", "%w2q"
    else:
        w1t, w2t = f"tensor<{E}x{H}x{2*F}xf32>", f"tensor<{E}x{F}x{H}xf32>"
        prep, xs, xt, a1, a2 = "", "%s", f"tensor<{R}x{H}xf32>", "%w1", "%w2"
    return f"""func.func @{name}(%x: tensor<{T}x{H}xf32>, %router_w: tensor<{H}x{E}xf32>,
                  %w1: tensor<{E}x{H}x{2*F}xf32>, %w2: tensor<{E}x{F}x{H}xf32>) -> tensor<{T}x{H}xf32> {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{T}x{E}xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
  %logits = linalg.matmul ins(%x, %router_w : tensor<{T}x{H}xf32>, tensor<{H}x{E}xf32>)
                          outs(%z : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
  %idx, %w = moe.router %logits top_k({K}) softmax{norm}
      : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts({E}){f" pad_to({pad})" if pad > 1 else ""}
      : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32>
      -> tensor<{R}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
{prep}  %y = moe.grouped_mlp {xs}, {a1}, {a2}, %o
      : {xt}, {w1t}, {w2t}, tensor<{E+1}xi32> -> tensor<{R}x{H}xf32>
  %out = moe.combine %y, %w, %p
      : tensor<{R}x{H}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{H}xf32>
  return %out : tensor<{T}x{H}xf32>
}}
"""


def from_config(config, tokens, recipe=None):
    """The MoE block of a Qwen3-MoE-style config (a dict or a config.json path)."""
    if not isinstance(config, dict):
        with open(config) as f:
            config = json.load(f)
    if "num_experts" not in config and "num_local_experts" in config:
        config = dict(config, num_experts=config["num_local_experts"])  # transformers 5
    for field in QWEN3_MOE_FIELDS:
        if field not in config:
            raise ValueError(f"config has no '{field}' (a Qwen3-MoE config needs "
                             f"{', '.join(QWEN3_MOE_FIELDS)})")
        if not isinstance(config[field], int) or config[field] < 1:
            raise ValueError(f"config '{field}' must be a positive integer, got {config[field]!r}")
    if config["num_experts_per_tok"] > config["num_experts"]:
        raise ValueError(f"config 'num_experts_per_tok' ({config['num_experts_per_tok']}) "
                         f"exceeds 'num_experts' ({config['num_experts']})")
    return moe_layer(tokens, config["hidden_size"], config["moe_intermediate_size"],
                     config["num_experts"], config["num_experts_per_tok"],
                     norm_topk_prob=bool(config.get("norm_topk_prob", True)), recipe=recipe)


def moe_layer_backward(tokens, hidden, ffn, experts, top_k, norm_topk_prob=True,
                       name="moe_layer_backward"):
    """MLIR for the gradient of moe_layer (f32 experts):

    @moe_layer_backward(x, router_w, w1, w2, dy) -> (dx, d_router_w, dw1, dw2)

    The forward is recomputed (nothing saved but the inputs); the expert MLP
    backward is moe.grouped_mlp_backward; the gradient of the combine weights
    flows through the top-k renormalization and the softmax to the router.
    """
    moe_layer(tokens, hidden, ffn, experts, top_k, norm_topk_prob)  # validates
    T, H, F, E, K = tokens, hidden, ffn, experts, top_k
    R = T * K
    norm = " norm_topk_prob" if norm_topk_prob else ""
    f32 = "f32"
    # dp for the selected experts: with renormalization wt_j = p_j / S,
    # d p_j = (dwt_j - sum_k dwt_k wt_k) / S; without, d p_j = dwt_j.
    if norm_topk_prob:
        dp_sel = """        %gs = tensor.extract %G[%t] : tensor<{T}xf32>
        %ss = tensor.extract %S[%t] : tensor<{T}xf32>
        %num = arith.subf %dwj, %gs : f32
        %v = arith.divf %num, %ss : f32""".format(T=T)
    else:
        dp_sel = "        %v = arith.addf %dwj, %zero_f : f32"
    return f"""#m_tk = affine_map<(t, j) -> (t, j)>
#m_t2 = affine_map<(t, j) -> (t)>
#m_tjh_tj = affine_map<(t, j, h) -> (t, j)>
#m_tjh_th = affine_map<(t, j, h) -> (t, h)>
#m_tjh = affine_map<(t, j, h) -> (t, j, h)>
#m_te = affine_map<(t, e) -> (t, e)>
#m_te_t = affine_map<(t, e) -> (t)>
#m_het_te = affine_map<(h, e, t) -> (t, e)>
#m_het_th = affine_map<(h, e, t) -> (t, h)>
#m_het_he = affine_map<(h, e, t) -> (h, e)>
#m_the_te = affine_map<(t, h, e) -> (t, e)>
#m_the_he = affine_map<(t, h, e) -> (h, e)>
#m_the_th = affine_map<(t, h, e) -> (t, h)>
func.func @{name}(%x: tensor<{T}x{H}xf32>, %router_w: tensor<{H}x{E}xf32>,
                  %w1: tensor<{E}x{H}x{2*F}xf32>, %w2: tensor<{E}x{F}x{H}xf32>,
                  %dy: tensor<{T}x{H}xf32>)
    -> (tensor<{T}x{H}xf32>, tensor<{H}x{E}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>) {{
  %zero = arith.constant 0.0 : f32
  %e_te = tensor.empty() : tensor<{T}x{E}xf32>
  %z_te = linalg.fill ins(%zero : f32) outs(%e_te : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
  %logits = linalg.matmul ins(%x, %router_w : tensor<{T}x{H}xf32>, tensor<{H}x{E}xf32>)
                          outs(%z_te : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
  %idx, %w = moe.router %logits top_k({K}) softmax{norm}
      : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts({E})
      : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32>
      -> tensor<{R}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
  %ye = moe.grouped_mlp %s, %w1, %w2, %o
      : tensor<{R}x{H}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{H}xf32>

  // d weights[t, j] = <dy[t], ye[p[t, j]]>
  %e_tk = tensor.empty() : tensor<{T}x{K}xf32>
  %z_tk = linalg.fill ins(%zero : f32) outs(%e_tk : tensor<{T}x{K}xf32>) -> tensor<{T}x{K}xf32>
  %dwt = linalg.generic {{indexing_maps = [#m_tjh_tj, #m_tjh_th, #m_tjh_tj],
                          iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%p, %dy : tensor<{T}x{K}xi32>, tensor<{T}x{H}xf32>) outs(%z_tk : tensor<{T}x{K}xf32>) {{
  ^bb0(%pos: i32, %g: f32, %acc: f32):
    %hh = linalg.index 2 : index
    %pi = arith.index_cast %pos : i32 to index
    %c0 = arith.constant 0 : index
    %ok = arith.cmpi sge, %pi, %c0 : index
    %ps = arith.select %ok, %pi, %c0 : index
    %yv = tensor.extract %ye[%ps, %hh] : tensor<{R}x{H}xf32>
    %prod = arith.mulf %g, %yv : f32
    %sum = arith.addf %acc, %prod : f32
    %r = arith.select %ok, %sum, %acc : f32
    linalg.yield %r : f32
  }} -> tensor<{T}x{K}xf32>

  // d ye: each copy's row is weights[t, j] * dy[t], in dispatch order (the
  // copies (t, j) flattened as tokens of one slot keep the same order).
  %e_tkh = tensor.empty() : tensor<{T}x{K}x{H}xf32>
  %scaled = linalg.generic {{indexing_maps = [#m_tjh_tj, #m_tjh_th, #m_tjh],
                             iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%w, %dy : tensor<{T}x{K}xf32>, tensor<{T}x{H}xf32>) outs(%e_tkh : tensor<{T}x{K}x{H}xf32>) {{
  ^bb0(%wv: f32, %g: f32, %o_: f32):
    %m = arith.mulf %wv, %g : f32
    linalg.yield %m : f32
  }} -> tensor<{T}x{K}x{H}xf32>
  %rows = tensor.collapse_shape %scaled [[0, 1], [2]] : tensor<{T}x{K}x{H}xf32> into tensor<{R}x{H}xf32>
  %idx_flat = tensor.collapse_shape %idx [[0, 1]] : tensor<{T}x{K}xi32> into tensor<{R}xi32>
  %idx_rows = tensor.expand_shape %idx_flat [[0, 1]] output_shape [{R}, 1] : tensor<{R}xi32> into tensor<{R}x1xi32>
  %dye, %o2, %c2, %p2 = moe.dispatch %rows, %idx_rows experts({E})
      : tensor<{R}x{H}xf32>, tensor<{R}x1xi32>
      -> tensor<{R}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{R}x1xi32>
  %ds, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dye
      : tensor<{R}x{H}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>, tensor<{E+1}xi32>,
        tensor<{R}x{H}xf32> -> tensor<{R}x{H}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>
  // Rows back to their tokens: dx[t] = sum_j ds[p[t, j]].
  %ones = arith.constant dense<1.0> : tensor<{T}x{K}xf32>
  %dx_experts = moe.combine %ds, %ones, %p
      : tensor<{R}x{H}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{H}xf32>

  // Router: p = softmax(logits); S = sum of the selected p; G = sum dwt * w.
  %probs = linalg.softmax dimension(1) ins(%logits : tensor<{T}x{E}xf32>)
      outs(%e_te : tensor<{T}x{E}xf32>) -> tensor<{T}x{E}xf32>
  %e_t = tensor.empty() : tensor<{T}xf32>
  %z_t = linalg.fill ins(%zero : f32) outs(%e_t : tensor<{T}xf32>) -> tensor<{T}xf32>
  %S = linalg.generic {{indexing_maps = [#m_tk, #m_t2], iterator_types = ["parallel", "reduction"]}}
      ins(%idx : tensor<{T}x{K}xi32>) outs(%z_t : tensor<{T}xf32>) {{
  ^bb0(%i: i32, %acc: f32):
    %t = linalg.index 0 : index
    %ii = arith.index_cast %i : i32 to index
    %pv = tensor.extract %probs[%t, %ii] : tensor<{T}x{E}xf32>
    %sum = arith.addf %acc, %pv : f32
    linalg.yield %sum : f32
  }} -> tensor<{T}xf32>
  %G = linalg.generic {{indexing_maps = [#m_tk, #m_tk, #m_t2], iterator_types = ["parallel", "reduction"]}}
      ins(%dwt, %w : tensor<{T}x{K}xf32>, tensor<{T}x{K}xf32>) outs(%z_t : tensor<{T}xf32>) {{
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %sum = arith.addf %acc, %m : f32
    linalg.yield %sum : f32
  }} -> tensor<{T}xf32>
  // d p[t, e]: nonzero for the selected experts only.
  %dp = linalg.generic {{indexing_maps = [#m_te], iterator_types = ["parallel", "parallel"]}}
      outs(%e_te : tensor<{T}x{E}xf32>) {{
  ^bb0(%o_: f32):
    %t = linalg.index 0 : index
    %ee = linalg.index 1 : index
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %cK = arith.constant {K} : index
    %zero_f = arith.constant 0.0 : f32
    %res = scf.for %j = %c0 to %cK step %c1 iter_args(%acc = %zero_f) -> (f32) {{
      %i = tensor.extract %idx[%t, %j] : tensor<{T}x{K}xi32>
      %ii = arith.index_cast %i : i32 to index
      %hit = arith.cmpi eq, %ii, %ee : index
      %dwj = tensor.extract %dwt[%t, %j] : tensor<{T}x{K}xf32>
{dp_sel}
      %next = arith.select %hit, %v, %acc : f32
      scf.yield %next : f32
    }}
    linalg.yield %res : f32
  }} -> tensor<{T}x{E}xf32>
  // Softmax backward: dl = p * (dp - sum_e p * dp).
  %dot = linalg.generic {{indexing_maps = [#m_te, #m_te, #m_te_t], iterator_types = ["parallel", "reduction"]}}
      ins(%probs, %dp : tensor<{T}x{E}xf32>, tensor<{T}x{E}xf32>) outs(%z_t : tensor<{T}xf32>) {{
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %sum = arith.addf %acc, %m : f32
    linalg.yield %sum : f32
  }} -> tensor<{T}xf32>
  %dl = linalg.generic {{indexing_maps = [#m_te, #m_te, #m_te_t, #m_te], iterator_types = ["parallel", "parallel"]}}
      ins(%probs, %dp, %dot : tensor<{T}x{E}xf32>, tensor<{T}x{E}xf32>, tensor<{T}xf32>) outs(%e_te : tensor<{T}x{E}xf32>) {{
  ^bb0(%a: f32, %b: f32, %d: f32, %o_: f32):
    %diff = arith.subf %b, %d : f32
    %r = arith.mulf %a, %diff : f32
    linalg.yield %r : f32
  }} -> tensor<{T}x{E}xf32>
  // d router_w = x^T dl; dx += dl router_w^T.
  %e_he = tensor.empty() : tensor<{H}x{E}xf32>
  %z_he = linalg.fill ins(%zero : f32) outs(%e_he : tensor<{H}x{E}xf32>) -> tensor<{H}x{E}xf32>
  %drw = linalg.generic {{indexing_maps = [#m_het_th, #m_het_te, #m_het_he],
                          iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%x, %dl : tensor<{T}x{H}xf32>, tensor<{T}x{E}xf32>) outs(%z_he : tensor<{H}x{E}xf32>) {{
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %sum = arith.addf %acc, %m : f32
    linalg.yield %sum : f32
  }} -> tensor<{H}x{E}xf32>
  %dx = linalg.generic {{indexing_maps = [#m_the_te, #m_the_he, #m_the_th],
                         iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%dl, %router_w : tensor<{T}x{E}xf32>, tensor<{H}x{E}xf32>) outs(%dx_experts : tensor<{T}x{H}xf32>) {{
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %sum = arith.addf %acc, %m : f32
    linalg.yield %sum : f32
  }} -> tensor<{T}x{H}xf32>
  return %dx, %drw, %dw1, %dw2
      : tensor<{T}x{H}xf32>, tensor<{H}x{E}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>
}}
"""


def _sum(rows, cols):
    """Lines summing %loss_prod (tensor<rows x cols x f32>) into %loss
    (tensor<f32>), by rows and then over the rows (no single long sum, which
    on a GPU would run in one thread)."""
    t = f"tensor<{rows}x{cols}xf32>"
    return f"""  %loss_zero = arith.constant 0.0 : f32
  %loss_ones_c = arith.constant dense<1.0> : tensor<{cols}x1xf32>
  %loss_er = tensor.empty() : tensor<{rows}x1xf32>
  %loss_zr = linalg.fill ins(%loss_zero : f32) outs(%loss_er : tensor<{rows}x1xf32>) -> tensor<{rows}x1xf32>
  %loss_rows = linalg.matmul ins(%loss_prod, %loss_ones_c : {t}, tensor<{cols}x1xf32>) outs(%loss_zr : tensor<{rows}x1xf32>) -> tensor<{rows}x1xf32>
  %loss_flat = tensor.collapse_shape %loss_rows [[0, 1]] : tensor<{rows}x1xf32> into tensor<{rows}xf32>
  %loss_row = tensor.expand_shape %loss_flat [[0, 1]] output_shape [1, {rows}] : tensor<{rows}xf32> into tensor<1x{rows}xf32>
  %loss_ones_r = arith.constant dense<1.0> : tensor<{rows}x1xf32>
  %loss_e1 = tensor.empty() : tensor<1x1xf32>
  %loss_z1 = linalg.fill ins(%loss_zero : f32) outs(%loss_e1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %loss_m = linalg.matmul ins(%loss_row, %loss_ones_r : tensor<1x{rows}xf32>, tensor<{rows}x1xf32>) outs(%loss_z1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %loss = tensor.collapse_shape %loss_m [] : tensor<1x1xf32> into tensor<f32>
"""


#: Element types moe_layer_vjp's arguments and output may have.
VJP_DTYPES = ("f32", "bf16")


def moe_layer_vjp(tokens, hidden, ffn, experts, top_k, norm_topk_prob=True,
                  dtype="f32", pad_to=1, name="moe_block"):
    """MLIR for the layer as an autograd framework calls it (e.g. through
    ``moe_mlir.torch``): ``@name(x, router_w, w1, w2, dy {moe.cotangent})
    -> (sum(out * dy), y {moe.output})``, arguments and ``y`` in `dtype`
    (f32 or bf16: widened to f32 on entry, ``y`` rounded once on exit; the
    GEMMs' precision is the pipeline's recipe). ``-moe-autodiff`` then
    ``-moe-split-backward`` make ``@name_grad_forward`` and
    ``@name_grad_backward`` of it (vjp_pipeline); the gradients have the
    arguments' dtype."""
    if dtype not in VJP_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(VJP_DTYPES)}, got {dtype!r}")
    T, H, F, E = tokens, hidden, ffn, experts
    text = moe_layer(T, H, F, E, top_k, norm_topk_prob, name=name, pad_to=pad_to)
    out_t = f"tensor<{T}x{H}xf32>"
    shapes = {"x": f"{T}x{H}", "router_w": f"{H}x{E}", "w1": f"{E}x{H}x{2*F}",
              "w2": f"{E}x{F}x{H}"}
    head = text.index(f"func.func @{name}(")
    open_ = text.index(f") -> {out_t} {{\n", head) + len(f") -> {out_t} {{\n")
    ret = text.index(f"  return %out : {out_t}", open_)
    body = text[open_:ret]
    suffix = "" if dtype == "f32" else "_in"
    args = [f"%{n}{suffix}: tensor<{d}x{dtype}>" for n, d in shapes.items()]
    args.append(f"%dy{suffix}: tensor<{T}x{H}x{dtype}> {{moe.cotangent}}")
    widen = "" if dtype == "f32" else "".join(
        f"  %{n} = arith.extf %{n}_in : tensor<{d}x{dtype}> to tensor<{d}xf32>\n"
        for n, d in {**shapes, "dy": f"{T}x{H}"}.items())
    y, y_t = "%out", out_t
    tail = ""
    if dtype != "f32":
        y, y_t = "%y_out", f"tensor<{T}x{H}x{dtype}>"
        tail = f"  %y_out = arith.truncf %out : {out_t} to {y_t}\n"
    return (f"func.func @{name}({', '.join(args)})\n"
            f"    -> (tensor<f32>, {y_t} {{moe.output = \"y\"}}) {{\n"
            + widen + body + tail
            + f"  %loss_prod = arith.mulf %out, %dy : {out_t}\n" + _sum(T, H)
            + f"  return %loss, {y} : tensor<f32>, {y_t}\n}}\n")


def vjp_pipeline(recipe, name="moe_block"):
    """The pass pipeline making ``@name_grad_forward`` / ``_backward`` of
    moe_layer_vjp's function (recipe: none, bf16 or mxfp8), nothing else."""
    keep = f"{name}_grad_forward,{name}_grad_backward"
    return (f"builtin.module(moe-train-pipeline{{autodiff=true recipe={recipe}}}, "
            f"moe-split-backward, symbol-privatize{{exclude={keep}}}, symbol-dce)")


def as_loss(text, name, rows, cols):
    """The function @name of `text`, which returns `%out : tensor<rows x cols
    x f32>`, as a loss for -moe-autodiff: it takes one more argument, a fixed
    output gradient `%dy` (marked moe.no_grad), and returns sum(out * dy) as
    tensor<f32>, summed by rows and then over the rows (no single long sum,
    which on a GPU would run in one thread)."""
    out_type = f"tensor<{rows}x{cols}xf32>"
    head = text.index(f"func.func @{name}(")
    sig = text.index(f") -> {out_type} {{", head)
    ret = text.index(f"  return %out : {out_type}", sig)
    body = (f"  %loss_prod = arith.mulf %out, %dy : {out_type}\n"
            + _sum(rows, cols) + "  return %loss : tensor<f32>")
    return (text[:sig] + f", %dy: {out_type} {{moe.no_grad}}) -> tensor<f32> {{"
            + text[sig + len(f") -> {out_type} {{"):ret] + body
            + text[ret + len(f"  return %out : {out_type}"):])
