# Sourced by scripts/desktop-smoke.sh and scripts/desktop-footprint.sh (which set $root): the
# desktop binary under test as an absolute path in $bin ($DESKTOP_BIN, else a debug build of
# relay-desktop), and the artifacts folder in $artifacts. $1 names the caller in messages.
desktop_bin() {
  cd "$root"
  if [ -n "${DESKTOP_BIN:-}" ]; then
    bin="$DESKTOP_BIN"
  else
    # The window's WebKit trim library too: the dashboard looks for it beside itself.
    cargo build -p relay-desktop -p modelrelay-webkit-trim
    bin="${CARGO_TARGET_DIR:-$root/target}/debug/modelrelay-desktop"
  fi
  [ -x "$bin" ] || { echo "$1: no binary at $bin" >&2; exit 1; }
  bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
  artifacts="$root/target/artifacts"
  mkdir -p "$artifacts"
}
