#!/usr/bin/env bash
# Prepares a machine for Mercury's tests and its docker sandbox. Idempotent and
# quick when everything is already there:
#   - the host tools the agent image is made of (dash, coreutils, grep, sed,
#     findutils, hostname: part of any Debian install, checked anyway),
#   - Debian's bubblewrap (the process sandbox backend; its tests run in CI),
#   - util-linux's setpriv and unshare, and useradd (tests/it/service.rs runs the host as the
#     systemd unit would: a fresh uid, its capabilities, its mount namespace),
#   - a Docker engine that answers (docker.io installed and dockerd started if needed),
#   - PostgreSQL 15's server, psql, openssl and flock (the storage tests start a throwaway
#     cluster with deploy/test-postgres.sh; docs/storage.md),
#   - Debian's chromium and chromium-driver (the dashboard's browser tests drive it over
#     WebDriver; tests/it/ui_browser.rs),
#   - a pinned virtualenv with mcp-server-time and the mcp SDK (extensions' tests),
#   - cargo-nextest (the test runner).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

missing=()
for t in dash:dash ls:coreutils grep:grep sed:sed find:findutils hostname:hostname \
    setpriv:util-linux unshare:util-linux useradd:passwd; do
  command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t##*:}")
done
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
ls -d /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql-15)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client-15)
for t in openssl:openssl flock:util-linux python3:python3; do
  command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t##*:}")
done
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd" >&2
  nohup dockerd >/tmp/mercury-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start (see /tmp/mercury-dockerd.log)" >&2; exit 1; }
fi

# Extensions' MCP servers (docs/extensions.md, tests/it/extensions.rs): a
# virtualenv on Debian's python3 (under /usr, which the bubblewrap sandbox
# binds), pinned, so a stdio server runs inside the sandbox with this one
# directory bound read-only.
MCP_VENV=/opt/mercury/mcp-venv
MCP_PINS="mcp-server-time==2026.10.19 mcp==2.3.0"
if ! "$MCP_VENV/bin/python" -c "import mcp_server_time, mcp" >/dev/null 2>&1; then
  echo "setup: installing $MCP_PINS in $MCP_VENV" >&2
  # Debian's own python3 makes the venv (a python3 earlier on PATH, pyenv's
  # say, is not under /usr), so it is the one that must have venv.
  /usr/bin/python3 -c "import venv, ensurepip" >/dev/null 2>&1 || {
    apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null; }
  /usr/bin/python3 -m venv "$MCP_VENV"
  # shellcheck disable=SC2086
  "$MCP_VENV/bin/pip" install -q $MCP_PINS
fi

# A real LiteLLM proxy for the model clients' interop tests
# (tests/it/litellm.rs, docs/models.md "Behind a LiteLLM proxy"), pinned.
LITELLM_VENV=/opt/mercury/litellm-venv
LITELLM_PIN="litellm[proxy]==1.108.7"
if ! "$LITELLM_VENV/bin/litellm" --version >/dev/null 2>&1; then
  echo "setup: installing $LITELLM_PIN in $LITELLM_VENV" >&2
  /usr/bin/python3 -m venv "$LITELLM_VENV"
  "$LITELLM_VENV/bin/pip" install -q "$LITELLM_PIN"
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install --locked cargo-nextest
fi
