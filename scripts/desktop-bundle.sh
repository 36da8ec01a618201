#!/usr/bin/env bash
# Builds the desktop installer for this machine with the prebuilt Tauri CLI from npm
# (src-tauri/package.json; no 15-minute `cargo install tauri-cli`).
#
# Usage: scripts/desktop-bundle.sh [BUNDLES]      BUNDLES defaults to "deb" on Linux
#        e.g. scripts/desktop-bundle.sh deb,rpm   (on macOS "dmg", on Windows "msi"; for the
#        AppImage run scripts/desktop-appimage.sh after the deb: it packs this build's binary
#        offline with our own runtime, where Tauri's "appimage" would download its tools)
# Output: <target dir>/release/bundle/<kind>/...  (CARGO_TARGET_DIR is honoured)
# Needs:  the system packages of installers/README.md, node + npm, and ui/dist (committed).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundles="${1:-deb}"

if [ ! -f "$root/ui/dist/index.html" ]; then
  echo "desktop-bundle: $root/ui/dist/index.html is missing: the window shows ui/dist" >&2
  exit 1
fi

cd "$root/src-tauri"
# npm ci: exactly the locked CLI version; a clean clone has no node_modules.
npm ci --no-audit --no-fund
# --ci: no prompts. `tauri build` enables tauri/custom-protocol itself and builds release.
# Thin LTO over 4 units for the desktop app (the workspace's release profile uses fat LTO for
# the small headless binary): whole-program LTO over WebKitGTK bindings and Tauri would add many
# minutes of single-threaded codegen to every bundle build. The environment overrides the
# profile; a caller's own setting wins.
export CARGO_PROFILE_RELEASE_LTO="${CARGO_PROFILE_RELEASE_LTO:-thin}"
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS="${CARGO_PROFILE_RELEASE_CODEGEN_UNITS:-4}"
target="${CARGO_TARGET_DIR:-$root/target}"
config=()
if [ "$(uname -s)" = Linux ]; then
  # The library the dashboard preloads into WebKit's processes (webkit-trim; src-tauri's
  # webkit_trim.rs looks for it in ../lib/modelrelay from its binary): built first, then added
  # to the .deb by a config merged over tauri.conf.json (the build's own target folder, which
  # the static config cannot name).
  cargo build --release --locked -p modelrelay-webkit-trim
  library="$target/release/libmodelrelay_webkit_trim.so"
  config=(--config "$(python3 -c 'import json, sys
print(json.dumps({"bundle": {"linux": {"deb": {"files": {
    "/usr/lib/modelrelay/libmodelrelay_webkit_trim.so": sys.argv[1]}}}}}))' "$library")")
fi
npx --no-install tauri build --ci --bundles "$bundles" "${config[@]}"

echo "desktop-bundle: built:"
find "$target/release/bundle" -maxdepth 2 -type f \( -name '*.deb' -o -name '*.rpm' -o -name '*.AppImage' \
  -o -name '*.dmg' -o -name '*.msi' -o -name '*.exe' \) \
  -exec ls -l {} \; 2>/dev/null || true
