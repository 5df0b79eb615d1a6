#!/usr/bin/env bash
# Runs the real-server lane (after setup.sh): real vLLM servers on loopback, a few minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-.venv/bin/python}" -m pytest -q -m realserver tests/realserver "$@"
