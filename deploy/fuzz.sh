#!/usr/bin/env bash
# Long fuzz runs: deploy/fuzz.sh DURATION [TARGET...] [--seed N] [--keep-current]
#
# Builds the fuzz driver (crates/fuzz) with optimizations and runs every
# target (or the ones named) for DURATION seconds each after replaying its
# corpus, printing per target the executions, executions per second,
# distinct outcomes, failures, the slowest input and the most memory one
# input held. Failing inputs land in fuzz-failures/<target>/; inputs that
# gave an outcome not seen before in fuzz-new/<target>/ (add the useful
# ones to crates/fuzz/corpus/<target>/). Exits non-zero when any input
# failed. --keep-current writes each input to fuzz-failures/<target>/current
# before it runs (slower), to keep one that kills the process. Example:
# deploy/fuzz.sh 600 (ten minutes per target).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 ]]; then
    echo "usage: deploy/fuzz.sh DURATION [TARGET...]" >&2
    exit 2
fi
duration=$1
shift

cargo build --release -p mtswarm-fuzz --bin mtswarm-fuzz
target_dir=${CARGO_TARGET_DIR:-target}
exec "$target_dir/release/mtswarm-fuzz" "$duration" "$@" \
    --failures fuzz-failures --save-new fuzz-new
