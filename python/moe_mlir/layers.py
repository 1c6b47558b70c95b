"""MoE layers as MLIR text, from arguments or a Hugging Face config.json.

    text = moe_mlir.layers.moe_layer(tokens=64, hidden=64, ffn=32, experts=8, top_k=2)
    text = moe_mlir.layers.from_config("config.json", tokens=1024)

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
              recipe=None, name="moe_layer"):
    """MLIR for one MoE block. recipe=None keeps f32 experts, "mxfp8" quantizes
    the expert GEMMs (hidden and ffn must then be multiples of 32)."""
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
    pad = 32 if recipe else 1
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
