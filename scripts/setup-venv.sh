#!/usr/bin/env bash
# Makes .venv/ in the checkout: Debian's Python 3.11 with torch (CPU use,
# without the CUDA wheels), numpy, safetensors, transformers, pytest and what
# builds the meshplan package (nanobind, scikit-build-core). Run by
# scripts/setup.sh; does nothing when .venv/ already has exactly this.
#
# PyPI's torch 2.15 for Linux is a CUDA build whose requirements add 2.3 GB
# of CUDA wheels. uv installs it without them (--excludes), and
# scripts/venv/mkstubs.py puts tiny stand-ins for the 13 CUDA libraries
# torch's libraries link into the venv, so `import torch` works and
# torch.cuda.is_available() is False: 1.4 GB instead of 5.4 GB
# (docs/python.md, "The venv").
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PYTHON=/usr/bin/python3
REQS=python/requirements/venv.txt
EXCLUDES=scripts/venv/cuda-excludes.txt
UV_VERSION=0.13.9
# The stamp records what the venv was made from; any change remakes it.
stamp=$(cat "$REQS" "$EXCLUDES" scripts/venv/mkstubs.py "$0" | sha256sum | cut -c1-16)

if [ -f "$VENV/.meshplan-stamp" ] && [ "$(cat "$VENV/.meshplan-stamp")" = "$stamp" ] &&
   "$VENV/bin/python" -c "import torch, nanobind, pytest" >/dev/null 2>&1; then
  echo "setup-venv: $VENV up to date"
  exit 0
fi

if [ ! -x "$PYTHON" ]; then
  echo "setup-venv: error: $PYTHON not found (scripts/setup.sh installs python3-venv)" >&2
  exit 1
fi
start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# pip's HTTP cache does nothing against PyPI's CDN here; uv's cache works
# (hard links within one file system, copies across).
"$VENV/bin/pip" install -q --disable-pip-version-check "uv==$UV_VERSION"
export UV_LINK_MODE=${UV_LINK_MODE:-copy}
if ! "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" \
    --excludes "$EXCLUDES" -r "$REQS"; then
  echo "setup-venv: error: installing $REQS into $VENV failed (network to PyPI?)" >&2
  rm -rf "$VENV"
  exit 1
fi
"$VENV/bin/python" scripts/venv/mkstubs.py >/dev/null
if ! "$VENV/bin/python" -c "import torch, numpy, safetensors, transformers, nanobind, pytest, matplotlib
assert not torch.cuda.is_available()
torch.ones(2) @ torch.ones(2)"; then
  echo "setup-venv: error: $VENV does not import torch after the install" >&2
  exit 1
fi
echo "$stamp" >"$VENV/.meshplan-stamp"
echo "setup-venv: made $VENV in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
