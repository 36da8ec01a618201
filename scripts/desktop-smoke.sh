#!/usr/bin/env bash
# Smoke test of the real desktop app (not the mock runtime):
#   1. GUI: under Xvfb + a private D-Bus session + trayer (an XEmbed tray host), with its config,
#      data and HOME in a temp dir, a free port and a small model server (smoke-backend.py):
#      the node answers, the window renders (not a blank page), the own worker connects, a
#      streamed request flows through the relay while the dashboard shows it, the tray menu
#      opens, its "Join as worker" turns the worker off (and saves it), its "Quit" drains and
#      exits 0.
#      Screenshots in target/artifacts/: desktop-window.png (first paint), desktop-dashboard.png
#      (a request in flight), desktop-tray.png (the tray menu open).
#   2. Headless: `modelrelay-desktop --serve` with no DISPLAY, WAYLAND_DISPLAY or session bus
#      serves /health and exits 0 on SIGTERM.
#   3. Footprint (scripts/desktop-footprint.sh): memory in the tray only (--hidden), with the
#      window open, after closing it and after reopening it from the tray (which must render
#      again); fails only on a gross regression. Table in target/artifacts/desktop-footprint.md.
#
# Usage: scripts/desktop-smoke.sh            (builds relay-desktop first, debug profile)
#        DESKTOP_BIN=path/to/modelrelay-desktop scripts/desktop-smoke.sh   (use that binary)
# Needs: xvfb (xvfb-run), dbus (dbus-run-session), trayer, xdotool, imagemagick, curl.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
magick_bin=/usr/bin  # ImageMagick's import/convert; /usr/local/bin/convert is not ImageMagick here

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Polls "$@" every 0.5 s until it succeeds or $1 seconds pass.
wait_for() {
  local secs="$1"; shift
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}

node_answers() { # the UI's status route, or the plain health check
  curl -sf --max-time 2 "http://127.0.0.1:$1/api/status" || curl -sf --max-time 2 "http://127.0.0.1:$1/health"
}

# ---------------------------------------------------------------------------------------------
# Inside Xvfb + dbus-run-session (the script calls itself).
if [ "${1:-}" = "--inside-xvfb" ]; then
  bin="$2" tmp="$3" port="$4" artifacts="$5"
  pids=()
  cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
  trap cleanup EXIT

  trayer --edge bottom --align right --widthtype request --height 32 --SetDockType true \
    --transparent false --tint 0x404040 >/dev/null 2>&1 &
  pids+=($!)
  sleep 1

  echo "smoke: starting $bin on 127.0.0.1:$port"
  # The locale is left as it is: under LANG=C.UTF-8 (this image's default) WebKitGTK reports
  # navigator.language "C", which Intl rejects; the UI must still render (ui/src/lib/locale.ts).
  HOME="$tmp/home" XDG_CONFIG_HOME="$tmp/home/.config" MODELRELAY_DATA_DIR="$tmp/data" \
    LOG_LEVEL=info "$bin" --config "$tmp/config.toml" --listen "127.0.0.1:$port" \
    >"$tmp/app.log" 2>&1 &
  app=$!
  pids+=("$app")

  if ! wait_for 90 node_answers "$port"; then
    echo "smoke: FAIL the node did not answer on :$port within 90 s" >&2
    tail -40 "$tmp/app.log" >&2
    exit 1
  fi
  echo "smoke: node answers: $(node_answers "$port" | head -c 200)"

  # The window (title "ModelRelay"); then wait until its content is no longer blank.
  # GTK may briefly show more than one X window with that name while the web view is set up
  # (one of them gone a moment later: a BadWindow error), so the id is looked up again on every
  # try, and only a window that still answers a geometry query counts.
  find_window() { # prints "id geometry" of a live, visible ModelRelay window
    local id geometry
    for id in $(xdotool search --onlyvisible --name '^ModelRelay$' 2>/dev/null | tac); do
      geometry="$(xdotool getwindowgeometry "$id" 2>/dev/null | tr '\n' ' ')" || continue
      echo "$id $geometry"
      return 0
    done
    return 1
  }
  if ! wait_for 60 find_window; then
    echo "smoke: FAIL no visible ModelRelay window within 60 s" >&2
    tail -40 "$tmp/app.log" >&2
    exit 1
  fi
  echo "smoke: window $(find_window || echo '(gone again; looked up on each try)')"
  window_rendered() {
    local win
    win="$(find_window | cut -d' ' -f1)" && [ -n "$win" ] || return 1
    "$magick_bin/import" -window "$win" "$tmp/window.png" 2>/dev/null || return 1
    local sd
    sd="$("$magick_bin/convert" "$tmp/window.png" -format '%[fx:standard_deviation]' info:)"
    echo "$sd" >"$tmp/window.sd"
    # A blank (single-colour) page is ~0; text and controls push it well above 0.01.
    awk -v sd="$sd" 'BEGIN { exit !(sd > 0.01) }'
  }
  if ! wait_for 60 window_rendered; then
    echo "smoke: FAIL the window stayed blank (std dev $(cat "$tmp/window.sd" 2>/dev/null))" >&2
    "$magick_bin/import" -window root "$artifacts/desktop-window.png" || true
    exit 1
  fi
  sleep 3 # let the dashboard's first fetches land before the picture
  "$magick_bin/import" -window root "$artifacts/desktop-window.png"
  sd="$("$magick_bin/convert" "$artifacts/desktop-window.png" -format '%[fx:standard_deviation]' info:)"
  echo "smoke: window rendered (window std dev $(cat "$tmp/window.sd"), screen $sd)"
  # The window opened signed in: the app hands its web view a one-time login link (never the
  # admin token to the page's scripts), and the node logs its use.
  if ! wait_for 20 grep -q 'dashboard signed in with a one-time link' "$tmp/app.log"; then
    echo "smoke: FAIL the dashboard window did not sign in with its login link" >&2
    tail -20 "$tmp/app.log" >&2
    exit 1
  fi
  echo "smoke: the window signed in with its one-time link"

  # The tray. trayer sits bottom-right; a click on the icon opens the menu, and GTK menus take
  # the keyboard: Down Down Down = "Join as worker" (the status line is disabled; then the
  # "Claude Code uses …" line, Run proxy, Join as worker), Up = "Quit".
  status() { # prints a field of /api/status's "node" object, e.g. status "d['roles']['worker']"
    curl -sf --max-time 2 "http://127.0.0.1:$port/api/status" |
      python3 -c "import json,sys; d=json.load(sys.stdin)['node']; print($1)"
  }
  own_worker_is() { [ "$(status "d['worker']['state']")" = "$1" ]; }
  worker_role_is() { [ "$(status "d['roles']['worker']")" = "$1" ]; }
  read -r sw sh < <(xdotool getdisplaygeometry)
  open_tray_menu() { xdotool mousemove $((sw - 16)) $((sh - 16)) click 1; sleep 1.5; }

  # Both roles are on: the node's own worker joins its own proxy with the smoke model server.
  if ! wait_for 60 own_worker_is connected; then
    echo "smoke: FAIL the own worker did not connect (state: $(status "d['worker']['state']"))" >&2
    exit 1
  fi

  # A request flows through: streamed, slow enough to be watched on the dashboard.
  relay_status() { # prints an expression over the whole /api/status document d
    curl -sf --max-time 2 "http://127.0.0.1:$port/api/status" | python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"
  }
  model_served() { [ "$(relay_status "'smoke-model' in [m['name'] for m in d['models']]")" = True ]; }
  streaming() { [ "$(relay_status "sum(r.get('tokens') or 0 for r in d['in_flight'])")" -gt 0 ]; }
  if ! wait_for 30 model_served; then
    echo "smoke: FAIL smoke-model never appeared among the relay's models" >&2
    exit 1
  fi
  curl -sN --max-time 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"smoke-model","stream":true,"messages":[{"role":"user","content":"hello"}]}' \
    >"$tmp/stream.out" 2>&1 &
  client=$!
  pids+=("$client")
  if ! wait_for 20 streaming; then
    echo "smoke: FAIL the request never showed as streaming in /api/status" >&2
    exit 1
  fi
  sleep 2 # two more pushes of the live feed: rows, tokens/s and the charts move
  "$magick_bin/import" -window root "$artifacts/desktop-dashboard.png"
  echo "smoke: request in flight on the dashboard (target/artifacts/desktop-dashboard.png)"
  wait "$client" || { echo "smoke: FAIL the streamed request failed: $(tail -c 300 "$tmp/stream.out")" >&2; exit 1; }
  grep -q 'data: \[DONE\]' "$tmp/stream.out" || {
    echo "smoke: FAIL the stream did not end with [DONE]: $(tail -c 300 "$tmp/stream.out")" >&2
    exit 1
  }
  [ "$(relay_status "d['totals']['requests']")" -ge 1 ] || { echo "smoke: FAIL totals did not count it" >&2; exit 1; }
  echo "smoke: the streamed request completed through the desktop app's relay"
  open_tray_menu
  "$magick_bin/import" -window root "$artifacts/desktop-tray.png"
  echo "smoke: tray menu open (target/artifacts/desktop-tray.png)"
  xdotool key Down Down Down Return
  if ! wait_for 20 worker_role_is False; then
    echo "smoke: FAIL the tray's 'Join as worker' did not turn the worker off" >&2
    tail -20 "$tmp/app.log" >&2
    exit 1
  fi
  grep -q 'worker = false' "$tmp/config.toml" || {
    echo "smoke: FAIL the role change was not saved to the config file" >&2
    cat "$tmp/config.toml" >&2
    exit 1
  }
  echo "smoke: tray 'Join as worker' turned the worker off and saved it"
  if ! kill -0 "$app" 2>/dev/null; then
    echo "smoke: FAIL the app died after using the tray" >&2
    tail -40 "$tmp/app.log" >&2
    exit 1
  fi

  # Tray "Quit": drains the node, exits 0.
  open_tray_menu
  xdotool key Up Return
  rc=0
  for _ in $(seq 1 90); do
    kill -0 "$app" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$app" 2>/dev/null; then
    echo "smoke: FAIL the app did not exit within 45 s of Quit" >&2
    tail -20 "$tmp/app.log" >&2
    exit 1
  fi
  wait "$app" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "smoke: FAIL exit code $rc after Quit" >&2
    tail -40 "$tmp/app.log" >&2
    exit 1
  fi
  grep -q "quitting: draining the node" "$tmp/app.log" || {
    echo "smoke: FAIL the app exited without draining" >&2
    exit 1
  }
  echo "smoke: GUI OK (Quit drained the node, exit 0)"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
. "$root/scripts/desktop-bin.sh"
desktop_bin smoke
tmp="$(mktemp -d)"
serve_pid=""
backend_pid=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
  [ -n "$backend_pid" ] && kill "$backend_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/home/.config" "$tmp/data"
# A configured node (so the window opens on the dashboard, not the first-run wizard) whose
# worker serves the smoke model server.
backend_port="$(free_port)"
python3 "$root/scripts/smoke-backend.py" "$backend_port" 16 0.5 &
backend_pid=$!
wait_for 10 curl -sf --max-time 1 "http://127.0.0.1:$backend_port/v1/models" ||
  { echo "smoke: the smoke model server did not start" >&2; exit 1; }
printf '[worker]\nbackend_url = "http://127.0.0.1:%s"\n' "$backend_port" >"$tmp/config.toml"

# 1. GUI under Xvfb. timeout bounds the whole run; xvfb-run stops Xvfb when the inner part ends.
port="$(free_port)"
timeout 300 xvfb-run -a -s "-screen 0 1280x800x24" \
  dbus-run-session -- bash "$0" --inside-xvfb "$bin" "$tmp" "$port" "$artifacts"
echo "smoke: screenshots in $artifacts (desktop-window.png, desktop-dashboard.png, desktop-tray.png)"

# 2. Headless --serve with no display and no session bus.
port="$(free_port)"
env -u DISPLAY -u WAYLAND_DISPLAY -u DBUS_SESSION_BUS_ADDRESS \
  HOME="$tmp/home" MODELRELAY_DATA_DIR="$tmp/data" \
  "$bin" --serve --config "$tmp/config.toml" --listen "127.0.0.1:$port" >"$tmp/serve.log" 2>&1 &
serve_pid=$!
if ! wait_for 30 curl -sf --max-time 2 "http://127.0.0.1:$port/health"; then
  echo "smoke: FAIL --serve did not answer /health on :$port" >&2
  cat "$tmp/serve.log" >&2
  exit 1
fi
echo "smoke: --serve /health: $(curl -sf "http://127.0.0.1:$port/health" | head -c 200)"
kill -TERM "$serve_pid"
rc=0
wait "$serve_pid" || rc=$?
serve_pid=""
if [ "$rc" -ne 0 ]; then
  echo "smoke: FAIL --serve exited $rc after SIGTERM" >&2
  cat "$tmp/serve.log" >&2
  exit 1
fi
echo "smoke: headless --serve OK"

# 3. Footprint: tray only, window open, closed, reopened.
DESKTOP_BIN="$bin" "$root/scripts/desktop-footprint.sh"
echo "smoke: PASS"
