#!/usr/bin/env python3
"""Runs N tuning jobs driven by the small local model and prints, per job,
whether it SUCCEEDED with a measured best, its model calls, its tokens and
its wall time, then the success rate per kind of job.

The model is the one deploy/local_model.sh installs, served by
`mtswarm llm serve`; the stack is `mtswarm up` on one emulated board cut
into two 8-core slices. The jobs: vecadd with one agent, and dgemm with two
agents. Model calls are read from the daemons' Prometheus metrics (the
GenAI client operation count of the leader and the workers) before and
after each job, with the seconds they took (summed over the agents); tokens
from the job's outcome (the server's usage reports), and prompt tokens per
call.

    python3 deploy/local_model_bench.py --vecadd 5 --dgemm 5

Needs a built `mtswarm` (`--mtswarm`, default: target/release/mtswarm,
else target/debug/mtswarm, else the one on PATH). On 2 cores a job takes
minutes: the model shares them with the emulator and the daemons.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parent.parent
FLEET = """[[board]]
id = "board0"
backend = "emulator"
slices = [{ cluster = 0, cores = 8 }, { cluster = 1, cores = 8 }]
"""
CALLS = re.compile(r"^gen_ai_client_operation_duration_seconds_count\{[^}]*\} ([0-9.e+]+)$")
MODEL_SECONDS = re.compile(r"^gen_ai_client_operation_duration_seconds_sum\{[^}]*\} ([0-9.e+]+)$")


def mtswarm_binary(given):
    if given:
        return given
    for build in ("release", "debug"):
        path = REPO / "target" / build / "mtswarm"
        if path.is_file():
            return str(path)
    found = shutil.which("mtswarm")
    if not found:
        sys.exit("no mtswarm binary: build it (cargo build --release -p mtswarm-cli) or pass --mtswarm")
    return found


def model_calls(urls):
    """GenAI client operations counted by the daemons' metrics so far, and
    the seconds they took (summed over agents, so it can exceed wall time
    when agents wait on the model together)."""
    total, seconds = 0.0, 0.0
    for url in urls:
        try:
            text = urllib.request.urlopen(url, timeout=10).read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            match = CALLS.match(line.strip())
            if match:
                total += float(match.group(1))
            match = MODEL_SECONDS.match(line.strip())
            if match:
                seconds += float(match.group(1))
    return int(total), seconds


def wait_for_file(path, seconds, what, process):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if path.is_file() and path.stat().st_size > 0:
            return json.loads(path.read_text())
        if process.poll() is not None:
            sys.exit(f"{what} exited ({process.returncode}) before it was ready")
        time.sleep(0.5)
    sys.exit(f"{what} not ready within {seconds} s")


def run_job(binary, env, leader, kernel, agents, args):
    base = [binary]
    submit = subprocess.run(
        base + ["submit", f"Tune {kernel} for speed", "--kernel", kernel, "--agents", str(agents),
                "--max-evaluations", str(args.max_evaluations), "--wall-time", str(args.wall_time),
                "--auto-approve", "--leader", leader],
        env=env, capture_output=True, text=True, check=False)
    match = re.search(r"submitted job (\S+)", submit.stdout + submit.stderr)
    if not match:
        return None, submit.stdout + submit.stderr
    job_id = match.group(1)
    subprocess.run(base + ["watch", job_id, "--no-prompt", "--leader", leader], env=env,
                   capture_output=True, text=True, check=False,
                   timeout=args.wall_time + 120)
    shown = subprocess.run(base + ["jobs", job_id, "--json", "--leader", leader], env=env,
                           capture_output=True, text=True, check=False)
    try:
        record = json.loads(shown.stdout)
    except json.JSONDecodeError:
        return job_id, shown.stdout + shown.stderr
    if isinstance(record, dict) and "jobs" in record:
        record = (record["jobs"] or [{}])[0]
    return job_id, record


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtswarm", help="the mtswarm binary")
    parser.add_argument("--serve-mtswarm",
                        help="the mtswarm binary that runs `llm serve` (default: --mtswarm); "
                             "lets an older build's daemons meet the same server")
    parser.add_argument("--vecadd", type=int, default=5, help="vecadd jobs (one agent)")
    parser.add_argument("--dgemm", type=int, default=5, help="dgemm jobs (two agents)")
    parser.add_argument("--max-evaluations", type=int, default=4)
    parser.add_argument("--wall-time", type=int, default=900, help="seconds per job")
    parser.add_argument("--tool-mode", default="text", choices=["text", "native"])
    parser.add_argument("--keep", action="store_true", help="keep the logs directory")
    parser.add_argument("--verbose", action="store_true",
                        help="the model server logs each request's timings (model-server.log; use with --keep)")
    args = parser.parse_args()
    binary = mtswarm_binary(args.mtswarm)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mtswarm-bench-"))
    serve_args = [args.serve_mtswarm or binary, "llm", "serve", "--json"] + (["--verbose"] if args.verbose else [])
    serve = subprocess.Popen(serve_args, stdout=subprocess.PIPE,
                             stderr=open(work / "model-server.log", "w"), text=True)
    line = serve.stdout.readline()
    if not line:
        sys.exit(f"mtswarm llm serve did not start; see {work / 'model-server.log'}")
    served = json.loads(line)
    (work / "fleet.toml").write_text(FLEET)
    env = dict(os.environ, HOME=str(work / "home"), MTSWARM_CONFIG=str(work / "home" / "config.toml"),
               MTSWARM_LLM_URL=served["url"], MTSWARM_LLM_MODEL=served["model"],
               MTSWARM_LLM_TOOL_MODE=args.tool_mode, MTSWARM_LLM_TIMEOUT_SECS="900",
               MTSWARM_LLM_CONTEXT_TOKENS=str(served.get("context_tokens", 8192)))
    (work / "home").mkdir()
    ready_file = work / "ready.json"
    up = subprocess.Popen(
        [binary, "up", "--fleet", str(work / "fleet.toml"), "--kernel-root", str(REPO / "examples" / "kernels"),
         "--nats-port", "0", "--metrics-port", "0", "--leader-listen", "127.0.0.1:0",
         "--ready-file", str(ready_file), "--log-dir", str(work / "logs")],
        env=env, stdout=open(work / "up.log", "w"), stderr=subprocess.STDOUT)
    rows = []
    try:
        ready = wait_for_file(ready_file, 300, "mtswarm up", up)
        metrics = [ready["metrics"]] + [w["metrics"] for w in ready.get("workers", [])]
        print(f"model {served['model']} at {served['url']}; logs in {work}")
        print(f"{'job':34} {'kernel':7} {'agents':>6} {'state':10} {'best GFLOPS':>11} "
              f"{'calls':>5} {'prompt':>7} {'/call':>5} {'compl.':>6} {'model s':>7} {'wall s':>6}")
        plan = [("vecadd", 1)] * args.vecadd + [("dgemm", 2)] * args.dgemm
        for kernel, agents in plan:
            (calls_before, seconds_before), started = model_calls(metrics), time.time()
            job_id, record = run_job(binary, env, ready["grpc"], kernel, agents, args)
            wall = time.time() - started
            calls_after, seconds_after = model_calls(metrics)
            calls, model_seconds = calls_after - calls_before, seconds_after - seconds_before
            if not isinstance(record, dict):
                print(f"{job_id or '?':34} {kernel:7} {agents:>6} ERROR      {record.strip()[:200]}")
                rows.append((kernel, False))
                continue
            outcome = record.get("outcome") or {}
            best = outcome.get("best") or {}
            total = outcome.get("total_cost") or {}
            prompt = int(total.get("prompt_tokens", 0) or 0)
            ok = str(record.get("state", "")).lower().endswith("succeeded") and bool(best.get("gflops"))
            rows.append((kernel, ok))
            print(f"{job_id:34} {kernel:7} {agents:>6} {str(record.get('state', '?')):10} "
                  f"{best.get('gflops', 0) or 0:>11.3f} {calls:>5} {prompt:>7} {prompt // max(calls, 1):>5} "
                  f"{total.get('completion_tokens', 0):>6} {model_seconds:>7.0f} {wall:>6.0f}")
        for kernel in ("vecadd", "dgemm"):
            done = [ok for k, ok in rows if k == kernel]
            if done:
                print(f"{kernel}: {sum(done)} of {len(done)} SUCCEEDED with a measured best")
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=120)
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=60)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
