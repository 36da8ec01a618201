#!/usr/bin/env bash
# Builds, once, the previous release's `modelrelay` (the commit before issue 28 changed how
# workers and proxies part and rejoin), for the mixed-versions fault scenarios: a worker of the
# previous release under this proxy, and this worker under the previous proxy. Cached outside the
# checkout ($PREVIOUS_RELEASE_DIR, default ~/.cache/modelrelay-previous/COMMIT), so later runs take
# a second; the first takes about 8 minutes of both cores (its own target directory).
# Prints the binary's path on its last line. Needs the commit in this clone's history.
set -euo pipefail
cd "$(dirname "$0")/.."
COMMIT=${PREVIOUS_RELEASE_COMMIT:-a55551d}
DIR=${PREVIOUS_RELEASE_DIR:-$HOME/.cache/modelrelay-previous/$COMMIT}
log() { echo "[previous-release $(date +%H:%M:%S)] $*" >&2; }
if [ -x "$DIR/modelrelay" ]; then
  log "modelrelay of $COMMIT: cached in $DIR"
  echo "$DIR/modelrelay"
  exit 0
fi
if ! git cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  log "commit $COMMIT is not in this clone (a shallow clone?): fetch it, or the mixed-versions tests are skipped"
  exit 1
fi
mkdir -p "$DIR/src"
log "building modelrelay of $COMMIT ($(git log -1 --format=%cs "$COMMIT")) in $DIR (first time: about 8 minutes)"
rm -rf "$DIR/src" && mkdir -p "$DIR/src"
git archive "$COMMIT" | tar -x -C "$DIR/src"
(cd "$DIR/src" && CARGO_TARGET_DIR="$DIR/target" cargo build --quiet --locked -p relay-core --bin modelrelay)
cp "$DIR/target/debug/modelrelay" "$DIR/modelrelay.partial"
mv "$DIR/modelrelay.partial" "$DIR/modelrelay"
rm -rf "$DIR/target" "$DIR/src"
log "built: $DIR/modelrelay"
echo "$DIR/modelrelay"
