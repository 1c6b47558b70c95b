#!/usr/bin/env bash
# Installs what moe-mlir needs on a Debian 12 machine: MLIR/LLVM 22 and build
# tools from Debian's packages, and the pinned Python packages of
# requirements.txt into ./.venv. Idempotent and quiet: prints one line per
# step that does something, and the log's tail on failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log=${MOE_SETUP_LOG:-/tmp/moe-mlir-setup.log}
: > "$log"

fail() { echo "setup: $1 failed; last lines of $log:" >&2; tail -n 30 "$log" >&2; exit 1; }

packages=(libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools clang-22 lld-22 clang-format-22
          libclang-rt-22-dev ninja-build ccache cmake libopenmpi-dev openmpi-bin python3-venv
          hmmer-examples zlib1g-dev nlohmann-json3-dev python3-psutil)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"; } >>"$log" 2>&1 || fail "apt-get install"
fi

# The project's Python: pyenv's or the system's python3, in a virtualenv.
venv="$root/.venv"
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  python3 -m venv "$venv" >>"$log" 2>&1 || fail "python3 -m venv"
fi
if ! cmp -s "$root/requirements.txt" "$stamp" 2>/dev/null; then
  echo "setup: installing Python packages (requirements.txt)"
  { "$venv/bin/python" -m pip install -q --upgrade pip &&
    "$venv/bin/python" -m pip install -q -r "$root/requirements.txt"; } >>"$log" 2>&1 || fail "pip install"
  cp "$root/requirements.txt" "$stamp"
fi
