#!/usr/bin/env bash
# Installs the system packages the tests need and a fresh Debian 12 machine lacks: curl and
# python3-venv (SDK suite), Chromium (UI tests in a real browser), the WebKitGTK/GTK/appindicator
# development libraries (the desktop crate), and Xvfb, a tray host and ImageMagick (the desktop
# smoke test), squashfs-tools (scripts/desktop-appimage.sh packs the AppImage with mksquashfs,
# its check reads it back with unsquashfs), nginx (the security suite puts a real reverse proxy
# in front of the relay), and PostgreSQL (the contract test of two proxies sharing one database
# starts a temporary cluster of its own; the package's default cluster is not used). Does nothing
# when everything is present; needs root (or sudo) otherwise.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
command -v curl >/dev/null || need+=(curl)
# `ip` makes the network namespaces of the fault suite's partition scenario.
command -v ip >/dev/null || need+=(iproute2)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
for pkg in chromium \
  libwebkit2gtk-4.1-dev libgtk-3-dev libayatana-appindicator3-dev librsvg2-dev libxdo-dev \
  libssl-dev pkg-config build-essential file \
  xvfb xauth dbus imagemagick trayer xdotool squashfs-tools postgresql nginx; do
  have_pkg "$pkg" || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0

echo "==> installing system packages: ${need[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# A private archive directory: a concurrent `apt-get update` elsewhere on the machine can delete
# .debs from the shared cache in the middle of an install (seen on this image).
archives="${TMPDIR:-/tmp}/modelrelay-apt"
mkdir -p "$archives/partial"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get -o Dir::Cache::archives="$archives" \
  -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}"
