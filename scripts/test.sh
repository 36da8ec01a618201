#!/usr/bin/env bash
# Runs every test: the Rust unit and contract suites, then the official OpenAI and Anthropic
# Python SDKs (and curl) against the real `modelrelay` binary.
# Python packages are installed into .venv on first run (from PyPI); later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> cargo test (unit, contract and command-line suites)"
cargo test --workspace

echo "==> SDK compatibility suite (official openai and anthropic Python SDKs, curl)"
if [ ! -x .venv/bin/pytest ] || ! cmp -s relay-core/tests/sdk/requirements.txt .venv/requirements.installed; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r relay-core/tests/sdk/requirements.txt
  cp relay-core/tests/sdk/requirements.txt .venv/requirements.installed
fi
cargo build --bin modelrelay
MODELRELAY_BIN="$PWD/target/debug/modelrelay" .venv/bin/pytest -q relay-core/tests/sdk
