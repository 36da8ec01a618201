#!/usr/bin/env bash
# Checks the .deb that scripts/desktop-bundle.sh built, the way a newcomer would meet it:
#   1. its control data names the package "modelrelay" and depends on the WebKitGTK runtime;
#   2. it holds the tray's binary and the window's, the library the window preloads into
#      WebKit's processes, the menu entry and the icons;
#   3. apt can install it here (a simulated `apt-get install ./modelrelay_*.deb`: resolves every
#      dependency without touching the machine);
#   4. the binary *from the package* passes scripts/desktop-smoke.sh (real window under Xvfb,
#      tray, Quit, headless --serve).
#
# Usage: scripts/desktop-deb-check.sh [path/to/modelrelay_*.deb]
#        (default: the newest .deb under <target dir>/release/bundle/deb/)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fail() { echo "deb-check: FAIL $*" >&2; exit 1; }

deb="${1:-}"
if [ -z "$deb" ]; then
  deb="$(ls -t "${CARGO_TARGET_DIR:-$root/target}"/release/bundle/deb/*.deb 2>/dev/null | head -1 || true)"
fi
[ -n "$deb" ] && [ -f "$deb" ] || fail "no .deb found: run scripts/desktop-bundle.sh deb first"
deb="$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")"
echo "deb-check: $deb ($(du -h "$deb" | cut -f1))"

# 1. Control data.
package="$(dpkg-deb --field "$deb" Package)"
depends="$(dpkg-deb --field "$deb" Depends)"
[ "$package" = "modelrelay" ] || fail "package name is '$package', expected 'modelrelay'"
grep -q "libwebkit2gtk-4.1-0" <<<"$depends" || fail "Depends lacks libwebkit2gtk-4.1-0: $depends"
echo "deb-check: package $package $(dpkg-deb --field "$deb" Version), depends: $depends"

# 2. Contents.
contents="$(dpkg-deb --contents "$deb")"
# dpkg-deb lists paths as "usr/..." or "./usr/..." depending on how the archive was made.
for path in usr/bin/modelrelay-desktop usr/bin/modelrelay-dashboard \
  usr/lib/modelrelay/libmodelrelay_webkit_trim.so \
  usr/share/icons/hicolor/128x128/apps/modelrelay-desktop.png; do
  grep -qE " (\./)?$path\$" <<<"$contents" || fail "the package has no /$path"
done
grep -qE ' (\./)?usr/share/applications/[^/]+\.desktop$' <<<"$contents" || fail "no menu entry (.desktop)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
dpkg-deb --extract "$deb" "$tmp/root"
entry="$(ls "$tmp"/root/usr/share/applications/*.desktop | head -1)"
grep -q '^Name=ModelRelay$' "$entry" || fail "menu entry $entry is not named ModelRelay"
grep -q '^Exec=modelrelay-desktop' "$entry" || fail "menu entry $entry does not start modelrelay-desktop"
echo "deb-check: contents OK (binary, $(basename "$entry"), icons)"

# 3. Installable: apt resolves the dependencies against this machine's archive.
if apt-get --simulate -qq install "$deb" >"$tmp/apt.log" 2>&1; then
  echo "deb-check: apt-get install would succeed ($(grep -c '^Inst' "$tmp/apt.log" || true) packages to install)"
else
  cat "$tmp/apt.log" >&2
  fail "apt-get cannot install the package"
fi

# 4. The packaged binary, started for real.
DESKTOP_BIN="$tmp/root/usr/bin/modelrelay-desktop" "$root/scripts/desktop-smoke.sh"
echo "deb-check: PASS"
