#!/usr/bin/env bash
# Runs every test:
#   1. the Rust suites of the workspace (unit, contract, command-line, model lifecycle, fuzzing,
#      faults, and the real-llama-server suite when ../shared/tools/realstack/setup.sh has built
#      its stack), then a short coverage-guided fuzzing run in an instrumented build;
#   2. the official OpenAI and Anthropic Python SDKs (and curl) against the real `modelrelay`;
#   3. the supply chain: every npm lockfile entry carries its registry integrity;
#   4. the web UI: its unit tests, a check that the embedded build (ui/dist) matches its sources,
#      and end-to-end tests in a real Chromium against real relays and workers (the real Open
#      WebUI among them, when scripts/real-clients.sh has cached it; CI does).
# The previous release's binary (scripts/previous-release.sh, cached in ~/.cache) is built first,
# for the mixed-versions scenario. Missing system packages are installed first
# (scripts/install-deps.sh); Python and npm packages
# are installed on first run into .venv and node_modules, and reused later.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

echo "==> supply chain: every npm lockfile entry carries its registry integrity"
node --test scripts/lockfiles.test.mjs

echo "==> web UI: install, build, unit tests"
(
  cd ui
  if [ ! -d node_modules ] || ! cmp -s package-lock.json node_modules/.package-lock.installed; then
    npm ci --no-audit --no-fund
    cp package-lock.json node_modules/.package-lock.installed
  fi
  npm run build
  npm test
)
if git rev-parse --git-dir >/dev/null 2>&1 && ! git diff --quiet -- ui/dist; then
  echo "ui/dist does not match the UI sources: run 'npm run build' in ui/ and commit ui/dist" >&2
  git --no-pager diff --stat -- ui/dist >&2
  exit 1
fi

echo "==> the previous release's modelrelay, for the mixed-versions fault scenario (built once, cached)"
if previous=$(./scripts/previous-release.sh | tail -n 1); then
  export MODELRELAY_PREVIOUS_BIN=$previous
fi

echo "==> cargo test (whole workspace)"
cargo test --workspace

echo "==> coverage-guided fuzzing (instrumented build; 5 s per target, the engine's self-test)"
FUZZ_SECONDS=5 ./scripts/fuzz.sh

echo "==> SDK compatibility suite (official openai and anthropic Python SDKs, curl)"
if [ ! -x .venv/bin/pytest ] || ! cmp -s relay-core/tests/sdk/requirements.txt .venv/requirements.installed; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r relay-core/tests/sdk/requirements.txt
  cp relay-core/tests/sdk/requirements.txt .venv/requirements.installed
fi
# `cargo test` above built target/debug/modelrelay (its integration tests run it). A separate
# `cargo build --bin modelrelay` would select relay-core alone, unify features differently
# and rebuild half the dependency tree for nothing.
[ -x target/debug/modelrelay ] || cargo build --bin modelrelay
MODELRELAY_BIN="$PWD/target/debug/modelrelay" .venv/bin/pytest -q relay-core/tests/sdk

echo "==> web UI end to end (Chromium, real relays and workers)"
(cd ui && MODELRELAY_BIN="$PWD/../target/debug/modelrelay" npm run test:e2e)
