#!/usr/bin/env bash
# Checks the AppImage that scripts/desktop-appimage.sh built, the way desktop-deb-check.sh checks
# the .deb:
#   1. format: an ELF with the AppImage type-2 magic "AI\x02" at byte 8, and a gzip squashfs
#      right where the runtime says it is (--appimage-offset), which squashfs-tools' own
#      unsquashfs reads too;
#   2. contents, unpacked by the runtime (--appimage-extract into a temp dir): AppRun, the menu
#      entry (Name=ModelRelay, Exec=modelrelay-desktop), the icons, the binary; the tree is the
#      same as unsquashfs makes of it (paths, kinds, modes, symlink targets, sizes);
#   3. the first start unpacks into the cache, a second start reuses that tree (no second
#      unpacking), and an app started from it keeps the AppImage's PID and sees APPIMAGE/APPDIR;
#   4. the AppImage file itself as DESKTOP_BIN of scripts/desktop-smoke.sh (real window under
#      Xvfb, tray, Quit, headless --serve, footprint).
# The unpacked copies go to a temp XDG_CACHE_HOME, removed at the end.
#
# Usage: scripts/desktop-appimage-check.sh [path/to/ModelRelay_*.AppImage]
#        (default: the newest .AppImage under <target dir>/release/bundle/appimage/)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fail() { echo "appimage-check: FAIL $*" >&2; exit 1; }

img="${1:-}"
if [ -z "$img" ]; then
  img="$(ls -t "${CARGO_TARGET_DIR:-$root/target}"/release/bundle/appimage/*.AppImage 2>/dev/null | head -1 || true)"
fi
[ -n "$img" ] && [ -f "$img" ] || fail "no .AppImage found: run scripts/desktop-appimage.sh first"
img="$(cd "$(dirname "$img")" && pwd)/$(basename "$img")"
[ -x "$img" ] || fail "$img is not executable"
echo "appimage-check: $img ($(du -h "$img" | cut -f1))"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
cache="$XDG_CACHE_HOME/modelrelay/appimage"
bytes() { od -An -c -j "$2" -N "$3" "$1" | tr -d ' '; } # file offset count, as od -c prints them
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# 1. Format.
[ "$(bytes "$img" 0 4)" = '177ELF' ] || fail "it does not start with an ELF header"
[ "$(bytes "$img" 8 3)" = 'AI002' ] || fail "no AppImage type-2 magic AI\\x02 at byte 8: $(bytes "$img" 8 3)"
offset="$("$img" --appimage-offset)"
[[ "$offset" =~ ^[0-9]+$ ]] || fail "--appimage-offset printed '$offset'"
[ "$(bytes "$img" "$offset" 4)" = 'hsqs' ] || fail "no squashfs at the offset $offset the runtime reports"
unsquashfs -stat -o "$offset" "$img" >"$tmp/stat" 2>&1 || { cat "$tmp/stat" >&2; fail "unsquashfs cannot read the image"; }
grep -q 'Compression gzip' "$tmp/stat" || fail "the image is not gzip-compressed: $(grep Compression "$tmp/stat")"
echo "appimage-check: ELF + AI\\x02, gzip squashfs at byte $offset; $("$img" --appimage-version)"

# 2. Contents, as the runtime unpacks them.
(cd "$tmp" && "$img" --appimage-extract >/dev/null) || fail "--appimage-extract failed"
tree="$tmp/squashfs-root"
[ -x "$tree/AppRun" ] || fail "no executable AppRun"
for program in modelrelay-desktop modelrelay-dashboard; do
  [ -x "$tree/usr/bin/$program" ] || fail "no executable usr/bin/$program"
done
[ -f "$tree/usr/lib/modelrelay/libmodelrelay_webkit_trim.so" ] ||
  fail "no usr/lib/modelrelay/libmodelrelay_webkit_trim.so (the window's WebKit trim)"
for entry in "$tree"/*.desktop "$tree"/usr/share/applications/*.desktop; do
  [ -f "$entry" ] || fail "no menu entry (.desktop) at the root or in usr/share/applications"
  grep -q '^Name=ModelRelay$' "$entry" || fail "menu entry ${entry#"$tree"/} is not named ModelRelay"
  grep -q '^Exec=modelrelay-desktop' "$entry" || fail "menu entry ${entry#"$tree"/} does not start modelrelay-desktop"
  grep -q '^Icon=modelrelay-desktop$' "$entry" || fail "menu entry ${entry#"$tree"/} has another icon"
done
[ "$(bytes "$tree/modelrelay-desktop.png" 1 3)" = 'PNG' ] || fail "no PNG icon modelrelay-desktop.png at the root"
[ "$(readlink "$tree/.DirIcon")" = modelrelay-desktop.png ] || fail ".DirIcon is not a link to the icon"
for size in 32x32 128x128 256x256 512x512; do
  [ -f "$tree/usr/share/icons/hicolor/$size/apps/modelrelay-desktop.png" ] || fail "no $size icon in usr/share/icons"
done
# Started by hand, AppRun finds its folder without the runtime's APPDIR.
version="$(env -u APPDIR "$tree/AppRun" --version)" || fail "squashfs-root/AppRun --version failed"
# An independent reader's view of the same image: paths, kinds, modes, link targets, contents.
unsquashfs -no-xattrs -quiet -no-progress -d "$tmp/reference" -o "$offset" "$img" >/dev/null
listing() { (cd "$1" && find . -mindepth 1 -printf '%p %y %m %l\n' | sort); }
{ diff <(listing "$tree") <(listing "$tmp/reference") && diff -r "$tree" "$tmp/reference"; } >"$tmp/diff" ||
  { cat "$tmp/diff" >&2; fail "the runtime unpacks another tree than unsquashfs does"; }
echo "appimage-check: contents OK (AppRun, modelrelay.desktop, icons, the binary: $version); same tree as unsquashfs"

# 3. First start unpacks, the second reuses the tree.
start=$(date +%s%N)
"$img" --version >"$tmp/first.out" 2>"$tmp/first.err" || { cat "$tmp/first.err" >&2; fail "the first start failed"; }
first_ms=$(ms_since "$start")
grep -q 'unpacked into' "$tmp/first.err" || fail "the first start did not unpack: $(cat "$tmp/first.err")"
[ "$(cat "$tmp/first.out")" = "$version" ] || fail "the first start printed '$(cat "$tmp/first.out")'"
entries="$(ls -A "$cache")"
[ "$(wc -l <<<"$entries")" = 1 ] || fail "the cache holds more than one tree: $entries"
before="$(stat -c '%i %Y' "$cache/$entries" "$cache/$entries/usr/bin/modelrelay-desktop")"
start=$(date +%s%N)
"$img" --version >"$tmp/second.out" 2>"$tmp/second.err" || { cat "$tmp/second.err" >&2; fail "the second start failed"; }
second_ms=$(ms_since "$start")
[ ! -s "$tmp/second.err" ] || fail "the second start said something: $(cat "$tmp/second.err")"
[ "$(cat "$tmp/second.out")" = "$version" ] || fail "the second start printed '$(cat "$tmp/second.out")'"
[ "$(ls -A "$cache")" = "$entries" ] || fail "the second start changed the cache: $(ls -A "$cache")"
[ "$(stat -c '%i %Y' "$cache/$entries" "$cache/$entries/usr/bin/modelrelay-desktop")" = "$before" ] ||
  fail "the second start unpacked the tree again"
echo "appimage-check: first start unpacked into the cache (${first_ms} ms), the second reused it (${second_ms} ms)"

# The runtime execs: the PID it started as is the app's, and the app sees the AppImage variables.
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
mkdir -p "$tmp/home"
env -u DISPLAY -u WAYLAND_DISPLAY -u DBUS_SESSION_BUS_ADDRESS HOME="$tmp/home" \
  MODELRELAY_DATA_DIR="$tmp/data" "$img" --serve --listen "127.0.0.1:$port" >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 60); do
  curl -sf --max-time 1 "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.5
done
curl -sf --max-time 2 "http://127.0.0.1:$port/health" >/dev/null || { cat "$tmp/serve.log" >&2; kill "$pid" 2>/dev/null; fail "--serve from the AppImage did not answer"; }
exe="$(readlink "/proc/$pid/exe")"
environ="$(tr '\0' '\n' <"/proc/$pid/environ")"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$exe" = "$cache/$entries/usr/bin/modelrelay-desktop" ] || fail "PID $pid is $exe, not the app from the cache"
grep -qx "APPIMAGE=$img" <<<"$environ" || fail "the app does not see APPIMAGE=$img"
grep -qx "APPDIR=$cache/$entries" <<<"$environ" || fail "the app does not see APPDIR=$cache/$entries"
[ "$rc" -eq 0 ] || { cat "$tmp/serve.log" >&2; fail "--serve exited $rc on SIGTERM sent to the AppImage's PID"; }
echo "appimage-check: PID $pid is the app itself (exe in the cache, APPIMAGE and APPDIR set), SIGTERM exits 0"

# 4. The AppImage, started for real.
DESKTOP_BIN="$img" "$root/scripts/desktop-smoke.sh"
[ "$(ls -A "$cache")" = "$entries" ] || fail "the smoke test's starts did not all reuse the one tree: $(ls -A "$cache")"
echo "appimage-check: PASS"
