"""python -m moe_mlir: command-line tools of the Python package.

    python -m moe_mlir export-hf RUN_DIR OUT_DIR [--config FILE]
                                 [--dtype float32|bfloat16] [--max-shard-size 5GB]
                                 [--alphabet protein|dna]

export-hf writes a moe-train checkpoint (RUN_DIR/checkpoint.safetensors, or
the file itself) as a transformers model directory (models.export_hf).
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
    args = parser.parse_args(argv)
    from .models import export_hf
    try:
        out = export_hf(args.checkpoint, args.config, args.out, dtype=args.dtype,
                        max_shard_size=args.max_shard_size, alphabet=args.alphabet)
    except (OSError, ValueError, KeyError) as err:
        print(f"python -m moe_mlir export-hf: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
