#!/usr/bin/env bash
# Installs dependencies, builds, and runs the dynamic-shape layernorm+gelu demo.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/build.sh" build
exec "$ROOT/build/dvm_demo" "$@"
