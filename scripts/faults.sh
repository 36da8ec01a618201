#!/usr/bin/env bash
# The fault-injection campaign: the scenarios of relay-core/tests/faults/ against the release
# binary, FAULTS_SCALE times larger than the test command's short version (default 10), one at
# a time so their numbers do not disturb each other. Prints one line per scenario:
#   faults SCENARIO: accepted N, answered N (K as clean errors), lost 0, hung 0, proxy RSS +X MB
# (RELIABILITY.md keeps the latest table). With SOAK_MINUTES set (e.g. 30), the soak runs too:
# traffic and faults mixed for that long, and the proxy's RSS curve minute by minute; then as
# long again with the proxy restarted (SIGTERM) every SOAK_RESTART_EVERY_SECS (default 180).
# FAULTS_FREEZE_SECS sets how long the freeze scenario keeps a process stopped (default 120).
set -euo pipefail
cd "$(dirname "$0")/.."
export FAULTS_SCALE="${FAULTS_SCALE:-10}"
# How long the freeze scenario keeps a worker, then the proxy, stopped (SIGSTOP): two minutes,
# as a suspended box might be; the test command's short version uses 6 s.
export FAULTS_FREEZE_SECS="${FAULTS_FREEZE_SECS:-120}"
cargo build --release --bin modelrelay
export MODELRELAY_TEST_BIN="$PWD/target/release/modelrelay"
echo "fault campaign at scale ${FAULTS_SCALE} against ${MODELRELAY_TEST_BIN}"
cargo test --release -p relay-core --test faults -- --nocapture --test-threads 1 2>&1 |
  grep -E '^faults |^test |panicked|test result'
