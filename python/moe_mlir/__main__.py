"""python -m moe_mlir: command-line tools of the Python package.

    python -m moe_mlir export-hf RUN_DIR OUT_DIR [--config FILE]
                                 [--dtype float32|bfloat16] [--max-shard-size 5GB]
                                 [--alphabet protein|dna]

    python -m moe_mlir torch-precompile OUT_DIR --config config.json
                                 --tokens 2048 4096 [--dtype bf16|f32]
                                 [--recipe bf16|mxfp8|none] [--target sm_90a]

export-hf writes a moe-train checkpoint (RUN_DIR/checkpoint.safetensors or,
from a run on several ranks, RUN_DIR/checkpoint.index.json and the files it
names; or the file itself) as a transformers model directory (models.export_hf).
torch-precompile compiles the layers moe_mlir.torch.patch runs for a
Qwen3-MoE config.json at those token counts (batch x sequence; each count's
bucket), for a machine without MLIR: patch(model, artifacts=OUT_DIR).
"""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m moe_mlir",
                                     description="moe-mlir's Python command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export-hf", help="a moe-train checkpoint as a transformers model "
                                          "directory (AutoModelForCausalLM, AutoTokenizer)")
    ex.add_argument("checkpoint", help="a moe-train run directory or its checkpoint.safetensors")
    ex.add_argument("out", help="the model directory to write")
    ex.add_argument("--config", help="the config.json the run trained (default: that of the "
                                     "run's --init-from directory)")
    ex.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ex.add_argument("--max-shard-size", default="5GB",
                    help="shard above this size (bytes, or like 5GB, 500MB; default 5GB)")
    ex.add_argument("--alphabet", choices=("protein", "dna"),
                    help="the tokenizer to write (default: the run's)")
    pc = sub.add_parser("torch-precompile",
                        help="compile moe_mlir.torch.patch's layers for a machine without MLIR")
    pc.add_argument("out", help="the folder to write (patch(model, artifacts=OUT))")
    pc.add_argument("--config", required=True,
                    help="a Qwen3-MoE config.json (hidden_size, moe_intermediate_size, "
                         "num_experts, num_experts_per_tok, norm_topk_prob)")
    pc.add_argument("--tokens", type=int, nargs="+", required=True,
                    help="token counts of the runs (batch x sequence)")
    pc.add_argument("--dtype", choices=("bf16", "f32"), default="bf16",
                    help="the model's dtype (default bf16)")
    pc.add_argument("--recipe", choices=("bf16", "mxfp8", "none"), default="bf16",
                    help="the patch's recipe (default bf16)")
    pc.add_argument("--target", default="sm_90a", help="cpu or a GPU chip (default sm_90a)")
    args = parser.parse_args(argv)
    if args.command == "torch-precompile":
        return _torch_precompile(args)
    from .models import export_hf
    try:
        out = export_hf(args.checkpoint, args.config, args.out, dtype=args.dtype,
                        max_shard_size=args.max_shard_size, alphabet=args.alphabet)
    except (OSError, ValueError, KeyError) as err:
        print(f"python -m moe_mlir export-hf: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _torch_precompile(args):
    import json
    from ._errors import MLIRError
    from .layers import from_config  # validates the config's fields
    try:
        with open(args.config) as f:
            config = json.load(f)
        from_config(config, 1)
        from .torch import precompile
        config.setdefault("num_experts", config.get("num_local_experts"))
        paths = precompile(args.out, config["hidden_size"], config["moe_intermediate_size"],
                           config["num_experts"], config["num_experts_per_tok"], args.tokens,
                           norm_topk_prob=bool(config.get("norm_topk_prob", True)),
                           dtype=args.dtype, recipe=args.recipe, target=args.target)
    except (OSError, ValueError, ImportError, RuntimeError, MLIRError) as err:
        print(f"python -m moe_mlir torch-precompile: {err}", file=sys.stderr)
        return 1
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
