#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite: the C++ tests (ctest), then the
# Python package (built by scikit-build-core in build-py, incrementally) and its pytest suite.
# Python: $PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/build.sh" build
cd "$ROOT/build"
ctest --output-on-failure -j "${DVM_JOBS:-2}"

cd "$ROOT"
PY="${PYTHON:-python3}"
echo "test: building and installing the Python package (build-py)"
CMAKE_BUILD_PARALLEL_LEVEL="${DVM_JOBS:-2}" "$PY" -m pip install -q --no-build-isolation \
  --no-deps --disable-pip-version-check --root-user-action=ignore "$ROOT"
"$PY" -m pytest -q "$ROOT/python/tests"
