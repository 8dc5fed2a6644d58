#!/usr/bin/env bash
# Soak run of the chaos suite (not part of CI).
#
# Repeats the chaos scenarios of `cargo test -p mtswarm-tests --test chaos`
# (worker SIGKILL, worker SIGSTOP/SIGCONT fencing, leader SIGKILL and
# restart, NATS restart, crashing slices, approvals across a move, submit
# bursts), one randomly chosen scenario per trial, until the duration is
# spent, then prints: trials, passes and failures per scenario, tasks lost,
# duplicate results accepted, and the reassignment times measured.
#
# Usage: deploy/soak.sh [DURATION]     DURATION in seconds (default 1800),
#                                      or with a unit: 90s, 30m, 2h.
# Environment:
#   SOAK_SCENARIOS  space-separated test-name filters to draw from
#                   (default: every scenario of the suite)
#   SOAK_LOG_DIR    where the per-trial logs and figures go (default: a
#                   new directory under /tmp); failed trials keep their log
#   CARGO_TARGET_DIR  honoured as usual
set -euo pipefail

cd "$(dirname "$0")/.."

duration_arg="${1:-${SOAK_DURATION:-1800}}"
case "$duration_arg" in
  *s) duration=${duration_arg%s} ;;
  *m) duration=$(( ${duration_arg%m} * 60 )) ;;
  *h) duration=$(( ${duration_arg%h} * 3600 )) ;;
  *) duration=$duration_arg ;;
esac
if ! [[ "$duration" =~ ^[0-9]+$ ]] || [ "$duration" -le 0 ]; then
  echo "soak: duration must be a positive number of seconds (or 30m, 2h): $duration_arg" >&2
  exit 2
fi

scenarios=(${SOAK_SCENARIOS:-worker_death fencing leader_death nats_restart flaky_slices approvals::pending approvals::undecided burst})
log_dir="${SOAK_LOG_DIR:-$(mktemp -d /tmp/mtswarm-soak-XXXXXX)}"
mkdir -p "$log_dir"
figures="$log_dir/figures.txt"
outcomes="$log_dir/outcomes.txt"
: > "$figures"
: > "$outcomes"

echo "soak: building the chaos suite"
cargo test -p mtswarm-tests --test chaos --no-run >"$log_dir/build.log" 2>&1 || {
  echo "soak: build failed, see $log_dir/build.log" >&2
  exit 2
}

echo "soak: running for ${duration}s; logs in $log_dir"
deadline=$(( $(date +%s) + duration ))
trial=0
while [ "$(date +%s)" -lt "$deadline" ]; do
  trial=$(( trial + 1 ))
  scenario=${scenarios[$(( RANDOM % ${#scenarios[@]} ))]}
  log="$log_dir/trial-$trial.log"
  started=$(date +%s)
  if MTSWARM_CHAOS_FIGURES="$figures" cargo test -q -p mtswarm-tests --test chaos -- \
      --nocapture "$scenario" >"$log" 2>&1; then
    verdict=pass
    rm -f "$log"
  else
    verdict=fail
  fi
  echo "$scenario $verdict" >> "$outcomes"
  printf 'soak: trial %d %-24s %s (%ss)\n' "$trial" "$scenario" "$verdict" "$(( $(date +%s) - started ))"
done

echo
echo "== soak summary: $trial trials in ${duration}s (logs: $log_dir)"
awk '{ n[$1]++; if ($2 == "pass") p[$1]++; else f[$1]++ }
     END { for (s in n) printf "  %-24s trials=%d pass=%d fail=%d\n", s, n[s], p[s]+0, f[s]+0 }' "$outcomes" | sort
awk '
  {
    for (i = 2; i <= NF; i++) {
      split($i, kv, "=")
      if (kv[1] == "tasks_lost" || kv[1] == "jobs_lost") lost += kv[2]
      if (kv[1] == "duplicates_accepted") dup += kv[2]
      if (kv[1] == "reassign_ms") { r[++nr] = kv[2] + 0 }
    }
  }
  END {
    printf "  tasks or jobs lost: %d\n  duplicate results accepted: %d\n", lost, dup
    if (nr == 0) { print "  reassign times: none measured"; exit }
    # insertion sort; a soak has at most a few thousand samples
    for (i = 2; i <= nr; i++) { v = r[i]; j = i - 1; while (j > 0 && r[j] > v) { r[j+1] = r[j]; j-- } r[j+1] = v }
    p95 = r[int((nr - 1) * 0.95) + 1]
    printf "  reassign times (ms, %d samples): min=%d median=%d p95=%d max=%d\n", nr, r[1], r[int((nr + 1) / 2)], p95, r[nr]
  }' "$figures"
if grep -q ' fail$' "$outcomes"; then
  echo "soak: some trials failed; their logs are in $log_dir" >&2
  exit 1
fi
