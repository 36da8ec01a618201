#!/usr/bin/env bash
# Builds the desktop app's AppImage offline, next to the .deb, from the release binary that
# scripts/desktop-bundle.sh built. Tauri's own AppImage bundler downloads linuxdeploy and the
# AppImage runtime from GitHub; this needs neither:
#   1. builds our runtime, packaging/appimage/runtime (an AppImage type-2 runtime that unpacks the
#      image into ~/.cache/modelrelay/appimage/<hash> on the first start instead of mounting it
#      with FUSE, then execs AppRun), and patches the AppImage magic "AI\x02" into its byte 8;
#   2. lays out the AppDir: AppRun, the menu entry and the icon at the root (as AppImage tools
#      expect) and under usr/share, the binaries in usr/bin, the library the window preloads
#      into WebKit's processes in usr/lib/modelrelay (as the .deb has it);
#   3. packs it with mksquashfs (gzip: the runtime reads it in pure Rust; reproducible: fixed
#      times, all files root's) and appends it to the runtime.
# Like the .deb, the AppImage bundles no libraries: it runs on the system's WebKitGTK 4.1, GTK 3
# and libayatana-appindicator3 (Debian 12 / Ubuntu 22.04 and newer: libwebkit2gtk-4.1-0).
#
# Usage:  scripts/desktop-appimage.sh        (after scripts/desktop-bundle.sh deb)
# Output: <target dir>/release/bundle/appimage/ModelRelay_<version>_<arch>.AppImage
#         (CARGO_TARGET_DIR is honoured for the app; the runtime builds in
#         packaging/appimage/target)
# Needs:  mksquashfs (squashfs-tools), cargo, python3. Check it with desktop-appimage-check.sh.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fail() { echo "desktop-appimage: $*" >&2; exit 1; }

target="${CARGO_TARGET_DIR:-$root/target}"
bin="$target/release/modelrelay-desktop"
# The tray process and the dashboard window's process: the tray starts the window from beside
# itself.
window_bin="$target/release/modelrelay-dashboard"
# The library the window preloads into WebKit's processes (src-tauri's webkit_trim.rs), which
# scripts/desktop-bundle.sh builds on Linux.
trim_lib="$target/release/libmodelrelay_webkit_trim.so"
for program in "$bin" "$window_bin" "$trim_lib"; do
  [ -x "$program" ] || fail "no release build at $program: run scripts/desktop-bundle.sh deb first"
done
command -v mksquashfs >/dev/null ||
  fail "mksquashfs is missing: apt-get install squashfs-tools (scripts/install-deps.sh does)"

# Name, version and menu text from the app's Tauri config, as the .deb has them.
read -r version comment < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(c["version"], c["bundle"]["shortDescription"])' "$root/src-tauri/tauri.conf.json")
arch="$(dpkg --print-architecture 2>/dev/null || uname -m)"
out_dir="$target/release/bundle/appimage"
out="$out_dir/ModelRelay_${version}_${arch}.AppImage"

# 1. The runtime: its own crate, lock file and target dir (not a workspace member).
runtime_target="$root/packaging/appimage/target"
CARGO_TARGET_DIR="$runtime_target" cargo build --release --locked --quiet \
  --manifest-path "$root/packaging/appimage/runtime/Cargo.toml"
runtime="$runtime_target/release/modelrelay-appimage-runtime"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
appdir="$work/AppDir"

# 2. The AppDir.
install -D -m 0755 "$bin" "$appdir/usr/bin/modelrelay-desktop"
install -D -m 0755 "$window_bin" "$appdir/usr/bin/modelrelay-dashboard"
install -D -m 0644 "$trim_lib" "$appdir/usr/lib/modelrelay/libmodelrelay_webkit_trim.so"
cat >"$appdir/AppRun" <<'EOF'
#!/bin/sh
# Starts ModelRelay from the unpacked AppImage. The runtime sets APPDIR; without it
# (squashfs-root/AppRun started by hand) this script's folder is the AppDir. `exec` keeps the
# process id, so whoever started the AppImage holds the app's own PID. No bundled libraries:
# the app uses the system's WebKitGTK 4.1 and GTK 3.
APPDIR="${APPDIR:-$(dirname "$(readlink -f "$0")")}"
export APPDIR
exec "$APPDIR/usr/bin/modelrelay-desktop" "$@"
EOF
chmod 0755 "$appdir/AppRun"

# The .deb's menu entry (the same template); "DeveloperTool" is Tauri's category for the
# freedesktop "Development;". X-AppImage-Version is what AppImage tools show.
mkdir -p "$appdir/usr/share/applications"
comment="$(printf '%s' "$comment" | sed 's/[&|\\]/\\&/g')" # literal in sed's replacement
sed -e "s|{{comment}}|$comment|" -e 's|{{categories}}|Development;|' \
  -e 's|{{exec}}|modelrelay-desktop|g' -e 's|{{icon}}|modelrelay-desktop|' \
  "$root/src-tauri/linux/modelrelay.desktop" >"$appdir/modelrelay.desktop"
echo "X-AppImage-Version=$version" >>"$appdir/modelrelay.desktop"
if grep -q '{{' "$appdir/modelrelay.desktop"; then
  fail "unfilled placeholder in the menu entry: $(grep '{{' "$appdir/modelrelay.desktop")"
fi
cp "$appdir/modelrelay.desktop" "$appdir/usr/share/applications/modelrelay.desktop"

for icon in 32x32:32x32.png 64x64:64x64.png 128x128:128x128.png 256x256:128x128@2x.png \
  512x512:icon.png; do
  install -D -m 0644 "$root/icons/${icon#*:}" \
    "$appdir/usr/share/icons/hicolor/${icon%%:*}/apps/modelrelay-desktop.png"
done
# The root icon (named after the entry's Icon=) and .DirIcon, the AppDir's thumbnail.
cp "$root/icons/128x128@2x.png" "$appdir/modelrelay-desktop.png"
ln -s modelrelay-desktop.png "$appdir/.DirIcon"

# 3. The image, then runtime + image.
mksquashfs "$appdir" "$work/image.squashfs" -noappend -all-root -no-xattrs -comp gzip \
  -mkfs-time 0 -all-time 0 -quiet -no-progress >/dev/null

cp "$runtime" "$work/runtime"
# Type 2 magic in the ELF identification's padding (bytes 8-10), which the kernel ignores.
[ "$(od -An -tx1 -j8 -N3 "$work/runtime" | tr -d ' ')" = "000000" ] ||
  fail "bytes 8-10 of the runtime are not free for the AppImage magic"
printf 'AI\002' | dd of="$work/runtime" bs=1 seek=8 conv=notrunc status=none
# The runtime finds the image at the end of its own ELF file; that must be where it is appended.
offset="$("$work/runtime" --appimage-offset)"
size="$(stat -c %s "$work/runtime")"
[ "$offset" = "$size" ] || fail "the runtime ends at byte $size but reports offset $offset"

mkdir -p "$out_dir"
cat "$work/runtime" "$work/image.squashfs" >"$work/out.AppImage"
chmod 0755 "$work/out.AppImage"
mv -f "$work/out.AppImage" "$out"
echo "desktop-appimage: built $out ($(du -h "$out" | cut -f1); runtime $size bytes, image at byte $offset)"
