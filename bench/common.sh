# Sourced by bench/run-gemm.sh and bench/run-layer.sh, which define
# prepare() (here, with MLIR) and run() (on the GPU machine):
#   bench_args "DEFAULT TOKENS" "$@"   [prepare|run|all] [TOKENS...] into
#                                      $mode (default all) and $tokens;
#                                      --help prints the calling script's
#                                      header comment; a token that is not a
#                                      positive integer stops with a message
#   bench_python SCRIPT ARGS...        builds libmoert and runs a bench/
#                                      Python script with the package on it
#   bench_main                         runs prepare, run or both for $mode
#   qwen_layers_config LAYERS > FILE   Qwen3-30B-A3B's config.json with
#                                      LAYERS decoder layers
#   train_data DIR                     copies the training benches' sequence
#                                      files into DIR/data
#   train_data_args DIR                their --data arguments, on one line
#   check_shapes VAR SHAPE...          stops with a message naming VAR unless
#                                      every SHAPE is BATCHxSEQ
#   recipe_flags RECIPE                moe-train flags of a bench recipe name:
#                                      -lf --layer-functions, -rc also
#                                      --recompute (bf16-rc), -lcN
#                                      --loss-chunk-rows N (bf16-lc4096),
#                                      -dense also --dense in the recipe
#                                      (fp8-blockwise-dense: the dense GEMMs
#                                      and LM head too), in any combination;
#                                      --recipe is the name without them
bench_args() {
  local defaults=$1 t
  shift
  mode=all
  case "${1:-}" in
    prepare|run|all) mode=$1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  esac
  tokens=("$@")
  [ ${#tokens[@]} -gt 0 ] || read -r -a tokens <<<"$defaults"
  for t in "${tokens[@]}"; do
    [[ "$t" =~ ^[1-9][0-9]*$ ]] ||
      { echo "$(basename "$0" .sh): TOKENS must be positive integers, got '$t'" >&2; exit 2; }
  done
}

bench_python() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build}
  "$root/scripts/build-runtime.sh" "$rt"
  PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" \
    python3 "$root/bench/$1" "${@:2}"
}

bench_main() {
  case "$mode" in
    prepare) "$root/scripts/build-runtime.sh" --vendor-json; prepare ;;
    run) run ;;
    all) "$root/scripts/build-runtime.sh" --vendor-json; prepare; run ;;
  esac
}

qwen_layers_config() {
  python3 - "$root/test/Models/Inputs/qwen3-30b-a3b-2layers.json" "$1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = int(sys.argv[2])
print(json.dumps(c, indent=2))
PY
}

train_files=(Pkinase.sto fn3.sto globins45.fa)
train_data() {
  mkdir -p "$1/data"
  local f
  for f in "${train_files[@]}"; do
    cp "/usr/share/doc/hmmer/examples/tutorial/$f" "$1/data/"
  done
}
train_data_args() {
  local f
  for f in "${train_files[@]}"; do
    printf -- '--data %s ' "$1/data/$f"
  done
}

recipe_flags() {
  # Suffixes in any order and combination (bf16-lf-lc4096,
  # fp8-blockwise-dense-rc); what is left is the recipe.
  local name=$1 flags=() dense=0
  while :; do
    if [[ "$name" =~ ^(.*)-lc([0-9]+)$ ]]; then
      name=${BASH_REMATCH[1]}; flags+=("--loss-chunk-rows ${BASH_REMATCH[2]}")
    elif [[ "$name" == *-lf ]]; then
      name=${name%-lf}; flags+=("--layer-functions")
    elif [[ "$name" == *-rc ]]; then
      name=${name%-rc}; flags+=("--layer-functions --recompute")
    elif [[ "$name" == *-dense ]]; then
      name=${name%-dense}; dense=1
    else
      break
    fi
  done
  echo "--recipe $name"
  [ "$dense" = 0 ] || echo "--dense $name"
  local f
  for f in ${flags[@]+"${flags[@]}"}; do echo "$f"; done
}

check_shapes() {
  local var=$1 s
  shift
  for s in "$@"; do
    [[ "$s" =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] ||
      { echo "$(basename "$0" .sh): $var takes BATCHxSEQ, got '$s'" >&2; exit 2; }
  done
}
