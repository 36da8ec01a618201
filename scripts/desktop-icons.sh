#!/usr/bin/env bash
# Regenerates every icon from the one source image, icons/source.svg:
#   - the app icon set Tauri bundles (32x32.png, 64x64.png, 128x128.png, 128x128@2x.png,
#     icon.png, icon.ico, icon.icns) via the prebuilt Tauri CLI (`tauri icon`);
#   - the four tray variants icons/tray/{off,proxy,worker,error}.png: the mark with a status dot
#     (off: greyed mark, grey dot; proxy up: sky-blue dot; worker connected: green; error: red).
# Needs rsvg-convert (librsvg2-bin) and ImageMagick (/usr/bin/convert; /usr/local/bin/convert on
# the team's machine is a stand-in, not ImageMagick), and node/npm for the Tauri CLI.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
icons="$root/icons"
src="$icons/source.svg"
magick=/usr/bin/convert
[ -x "$magick" ] || magick="$(command -v convert)"
command -v rsvg-convert >/dev/null || { echo "rsvg-convert missing: apt-get install librsvg2-bin" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. One 1024 px master, then Tauri's own generator for the platform formats.
rsvg-convert -w 1024 -h 1024 "$src" -o "$work/master.png"
if [ ! -x "$root/src-tauri/node_modules/.bin/tauri" ]; then
  (cd "$root/src-tauri" && npm ci --no-audit --no-fund)
fi
(cd "$root/src-tauri" && npx --no-install tauri icon "$work/master.png" -o "$work/set") >"$work/icon.log" 2>&1 \
  || { cat "$work/icon.log" >&2; exit 1; }
for f in 32x32.png 64x64.png 128x128.png 128x128@2x.png icon.png icon.ico icon.icns; do
  cp "$work/set/$f" "$icons/$f"
done

# 2. Tray variants, 64 px (trays scale down; 64 keeps HiDPI panels sharp). Rendered from the
#    SVG at the final size rather than downscaled, so the strokes stay crisp.
mkdir -p "$icons/tray"
rsvg-convert -w 64 -h 64 "$src" -o "$work/tray-base.png"
dot() { # $1 = input, $2 = colour, $3 = output: a dot with a white ring, bottom-right
  "$magick" "$1" -fill white -stroke none -draw "circle 51,51 51,39" \
    -fill "$2" -draw "circle 51,51 51,42" PNG32:"$3"
}
"$magick" "$work/tray-base.png" -colorspace Gray -channel A -evaluate multiply 0.85 +channel \
  -colorspace sRGB PNG32:"$work/tray-grey.png"
dot "$work/tray-grey.png" '#9CA3AF' "$icons/tray/off.png"
dot "$work/tray-base.png" '#38BDF8' "$icons/tray/proxy.png"
dot "$work/tray-base.png" '#22C55E' "$icons/tray/worker.png"
dot "$work/tray-base.png" '#EF4444' "$icons/tray/error.png"

echo "icons regenerated in $icons"
