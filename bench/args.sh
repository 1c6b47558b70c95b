# Sourced by bench/run-gemm.sh and bench/run-layer.sh:
#   bench_args "DEFAULT TOKENS" "$@"
# parses [prepare|run|all] [TOKENS...] into $mode (default all) and the array
# $tokens (default DEFAULT TOKENS); --help prints the calling script's header
# comment; a token that is not a positive integer stops with a message.
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
