#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser that sees network bytes (the targets of
# relay-core/tests/fuzz/): an instrumented build (`-C instrument-coverage`, profile `fuzz`:
# optimised, with debug assertions and overflow checks) in target/fuzz-coverage/, each target run
# for FUZZ_SECONDS (default 300) with a random seed, one at a time (the coverage counters are
# process-wide). Inputs that reached new code are kept in target/fuzz-corpus/TARGET/ and start the
# next run from there; copy the best into relay-core/tests/fuzz/corpus/TARGET/ to keep them in the
# repository. A panic saves its input under target/fuzz-crashes/ and prints the command that keeps
# it in the corpus as a regression test once fixed.
#
#   scripts/fuzz.sh                   # 5 minutes per target, random seed
#   FUZZ_SECONDS=3600 scripts/fuzz.sh
#   FUZZ_SEED=0x1c1a scripts/fuzz.sh  # replay a run (with the same target/fuzz-corpus)
#   FUZZ_GUIDED=0 scripts/fuzz.sh     # blind mutation in a plain release build
set -euo pipefail
cd "$(dirname "$0")/.."
export FUZZ_SECONDS="${FUZZ_SECONDS:-300}"
export FUZZ_SEED="${FUZZ_SEED:-$(( (RANDOM << 16) | RANDOM ))}"
if [ "${FUZZ_GUIDED:-1}" = 0 ]; then
  echo "fuzzing each target for ${FUZZ_SECONDS}s (blind), seed ${FUZZ_SEED} (FUZZ_SEED=${FUZZ_SEED} replays it)"
  exec cargo test --release -p relay-core --test fuzz -- --nocapture --test-threads 2 fuzz_
fi
export CARGO_TARGET_DIR="$PWD/target/fuzz-coverage"
export RUSTFLAGS="-C instrument-coverage --cfg fuzz_coverage"
# The profiling runtime writes its counters out when a process ends; nothing here reads them.
profiles="$CARGO_TARGET_DIR/profraw"
mkdir -p "$profiles"
export LLVM_PROFILE_FILE="$profiles/%p.profraw"
trap 'rm -rf "$profiles"' EXIT
echo "fuzzing each target for ${FUZZ_SECONDS}s (coverage-guided), seed ${FUZZ_SEED} (FUZZ_SEED=${FUZZ_SEED} replays it)"
cargo test --profile fuzz -p relay-core --test fuzz -- --nocapture --test-threads 1 fuzz_ guidance_ engine_
