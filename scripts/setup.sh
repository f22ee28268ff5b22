#!/usr/bin/env bash
# Installs what DVM needs from Debian (12 or 13), then the Python packages of the `dvm` package
# and its tests from PyPI. Idempotent: runs apt-get / pip only when a package is missing. Must
# run as root, or as a user with password-less sudo. Python: $PYTHON (default python3).
set -euo pipefail

PACKAGES=(cmake ninja-build g++ pkg-config libhwy-dev libgtest-dev libbenchmark-dev clang-format
  libopenblas-dev)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$pkg")
  fi
done

install_debian() {
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "setup: all packages present (${PACKAGES[*]})"
    return
  fi

  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO=(sudo -n)
    else
      echo "setup: missing packages (${missing[*]}) and not root; install them or rerun as root" >&2
      exit 1
    fi
  fi

  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
}
install_debian

# Python packages: the extension's build tools, numpy, pytest, torch (the CPU wheel 2.13.0; any
# other version would download gigabytes), matplotlib (benchmark plots), and the test clients
# transformers (HuggingFace models built from configs, no downloads) and expecttest (OpInfo).
PY="${PYTHON:-python3}"
PY_PACKAGES=(nanobind scikit-build-core numpy pytest torch==2.13.0 matplotlib transformers
  expecttest)
mapfile -t py_missing < <("$PY" - "${PY_PACKAGES[@]}" <<'PYEOF'
import sys
from importlib import metadata

for spec in sys.argv[1:]:
    name, _, version = spec.partition("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        print(spec)
        continue
    if version and have.split("+")[0] != version:
        print(spec)
PYEOF
)
if [ "${#py_missing[@]}" -eq 0 ]; then
  echo "setup: all Python packages present (${PY_PACKAGES[*]})"
else
  echo "setup: pip installing ${py_missing[*]}"
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    "${py_missing[@]}"
fi
