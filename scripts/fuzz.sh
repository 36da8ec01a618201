#!/usr/bin/env bash
# Fuzzes every parser that sees network bytes for longer than the test command does: each target
# of relay-core/tests/fuzz/ runs for FUZZ_SECONDS (default 300) with a random seed, in an
# optimized build. A panic saves its input under target/fuzz-crashes/ and prints the command
# that keeps it in the corpus as a regression test once fixed.
#
#   scripts/fuzz.sh                 # 5 minutes per target, random seed
#   FUZZ_SECONDS=3600 scripts/fuzz.sh
#   FUZZ_SEED=0x1c1a scripts/fuzz.sh  # replay a run
set -euo pipefail
cd "$(dirname "$0")/.."
export FUZZ_SECONDS="${FUZZ_SECONDS:-300}"
export FUZZ_SEED="${FUZZ_SEED:-$(( (RANDOM << 16) | RANDOM ))}"
echo "fuzzing each target for ${FUZZ_SECONDS}s, seed ${FUZZ_SEED} (FUZZ_SEED=${FUZZ_SEED} replays it)"
cargo test --release -p relay-core --test fuzz -- --nocapture --test-threads 2 fuzz_
