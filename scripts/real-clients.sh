#!/usr/bin/env bash
# Makes, once, the real clients and backend the end-to-end tests drive, all cached outside the
# checkout (each step is skipped when its output exists, so later runs take seconds):
#   1. the real llama-server and its tiny model ($REALSTACK, default ~/.cache/modelrelay-realstack),
#      built by ../shared/tools/realstack/setup.sh (about 7 minutes of both cores the first time);
#   2. the real Claude Code (npm @anthropic-ai/claude-code, $REALSTACK/claude-code);
#   3. the real Open WebUI (PyPI open-webui, ~/.cache/modelrelay-openwebui/venv; about 7 GB with
#      torch, about 15 minutes to download the first time).
# Tests that need one of them say they are skipped, and why, when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
REALSTACK=${REALSTACK:-$HOME/.cache/modelrelay-realstack}
OPEN_WEBUI_DIR=${OPEN_WEBUI_DIR:-$HOME/.cache/modelrelay-openwebui}
CLAUDE_CODE_VERSION=${CLAUDE_CODE_VERSION:-2.1.330}
OPEN_WEBUI_VERSION=${OPEN_WEBUI_VERSION:-0.12.4}
log() { echo "[real-clients $(date +%H:%M:%S)] $*"; }

# 1. llama-server and the model: the shared tool builds them (its steps skip what exists).
setup=""
for candidate in "${REALSTACK_SETUP:-}" ../shared/tools/realstack/setup.sh /work/shared/tools/realstack/setup.sh; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then setup=$candidate; break; fi
done
if [ -x "$REALSTACK/bin/llama-server" ] && [ -s "$REALSTACK/models/tiny-random-llama.gguf" ]; then
  log "llama-server and model: cached in $REALSTACK"
elif [ -n "$setup" ]; then
  log "building llama-server and the tiny model with $setup (first time: about 7 minutes)"
  REALSTACK=$REALSTACK "$setup"
else
  log "no realstack setup script found (set REALSTACK_SETUP): the real-llama-server tests will be skipped"
fi

# 2. Claude Code, pinned.
if [ "$("$REALSTACK/claude-code/node_modules/.bin/claude" --version 2>/dev/null | cut -d' ' -f1)" = "$CLAUDE_CODE_VERSION" ]; then
  log "Claude Code $CLAUDE_CODE_VERSION: cached in $REALSTACK/claude-code"
else
  log "installing Claude Code $CLAUDE_CODE_VERSION into $REALSTACK/claude-code"
  mkdir -p "$REALSTACK/claude-code"
  npm install --prefix "$REALSTACK/claude-code" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"
  "$REALSTACK/claude-code/node_modules/.bin/claude" --version
fi

# 3. Open WebUI, pinned, in its own venv.
venv=$OPEN_WEBUI_DIR/venv
if [ -x "$venv/bin/open-webui" ] && [ "$("$venv/bin/pip" show open-webui 2>/dev/null | sed -n "s/^Version: //p")" = "$OPEN_WEBUI_VERSION" ]; then
  log "Open WebUI $OPEN_WEBUI_VERSION: cached in $venv"
else
  log "installing Open WebUI $OPEN_WEBUI_VERSION into $venv (first time: about 7 GB, 15 minutes)"
  mkdir -p "$OPEN_WEBUI_DIR"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "open-webui==$OPEN_WEBUI_VERSION"
  log "Open WebUI installed ($(du -sh "$OPEN_WEBUI_DIR" | cut -f1))"
fi
log "done"
