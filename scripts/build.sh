#!/usr/bin/env bash
# Configures (Ninja, Release) and builds DVM.
#   scripts/build.sh [build-dir] [extra cmake args...]
# Build parallelism: DVM_JOBS (default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${1:-build}"
shift || true
case "$BUILD_DIR" in
  /*) ;;
  *) BUILD_DIR="$ROOT/$BUILD_DIR" ;;
esac

cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$BUILD_DIR" -j "${DVM_JOBS:-2}"
