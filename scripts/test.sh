#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/build.sh" build
cd "$ROOT/build"
ctest --output-on-failure -j "${DVM_JOBS:-2}"
