#!/usr/bin/env bash
# Installs dependencies, builds, and runs the demos: a dynamic-shape layernorm+gelu kernel
# (the runtime operator compiler) and a BERT-base encoder layer compiled once as a graph and
# run over 32 sequence lengths (the graph compiler). Arguments go to the kernel demo.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/build.sh" build
"$ROOT/build/dvm_demo" "$@"
echo
exec "$ROOT/build/dvm_bert_demo"
