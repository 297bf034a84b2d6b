#!/usr/bin/env bash
# Installs the Debian 12 packages meshplan builds against, only when some are
# missing. Safe to run repeatedly; it does nothing on a machine that has them.
set -euo pipefail

PACKAGES=(
  g++ make cmake ninja-build pkg-config lld
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  nlohmann-json3-dev libcli11-dev libgloo-dev libopenblas-dev
  libgtest-dev libbenchmark-dev python3-psutil
  # The Python package (python/, docs/python.md): Debian's Python 3.11, its
  # headers for the extension, and venv for .venv/ (scripts/setup-venv.sh).
  python3-dev python3-venv
  redis-server libhiredis-dev
  # The asan preset (make test-asan, make fuzz): clang of the same LLVM as
  # libMLIR, its sanitizer runtimes and libFuzzer.
  clang-22 libclang-rt-22-dev
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

# Installs the missing packages with apt-get (as root, or with sudo).
install_packages() {
  echo "setup: missing packages: ${missing[*]}"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: error: apt-get not found; meshplan expects Debian 12 (bookworm)." >&2
    echo "setup: install these packages by other means: ${missing[*]}" >&2
    exit 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      SUDO=sudo
    else
      echo "setup: error: installing packages needs root (run as root, or with passwordless sudo)." >&2
      echo "setup: missing: ${missing[*]}" >&2
      exit 1
    fi
  else
    SUDO=
  fi

  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get update -qq; then
    echo "setup: error: 'apt-get update' failed; check the network and /etc/apt/sources.list*" >&2
    exit 1
  fi
  if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    echo "setup: error: 'apt-get install' failed for: ${missing[*]}" >&2
    echo "setup: libmlir-22-dev needs a bookworm package source that carries LLVM 22." >&2
    exit 1
  fi
  echo "setup: installed ${#missing[@]} packages"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  install_packages
fi

# .venv/ in the checkout: torch and the package's test dependencies.
"$(dirname "$0")/setup-venv.sh"
