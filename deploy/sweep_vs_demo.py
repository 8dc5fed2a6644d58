#!/usr/bin/env python3
"""Side by side: `mtswarm demo` against an exhaustive parallel sweep of the
same tuning space (not part of CI).

For each binary given (e.g. a build before and after a change), in turn and
in the same run, so the machine's load is the same for all:

- demo: `mtswarm demo --json` on the kernel (builtin policies); its wall
  time, the CPU of it and everything it started (rusage of children), the
  candidates evaluated on the slices, the best GFLOPS, and the time from its
  start to the first trustworthy record of that best (`time_to_best_seconds`);
- sweep: every configuration of the kernel's tune.toml space
  (`mtswarm emu space`) run with `mtswarm emu run KERNEL -D ... --json`,
  `--jobs` processes at a time (default: nproc); its wall time, CPU, the
  configurations run, the best GFLOPS and when the sweep first had it.

Prints one table and, with `--json`, one JSON object. The figure the issue
asks for is the demo's time to its best over the sweep's wall time of the
same binary (target <= 0.3).

With `--sweep-only --save-sweep FILE` it runs only the sweep of the first
binary and writes every configuration's figures as a Kernel Tuner cache
file (`time` in ms, `__error__` for a failed run; see
crates/hw/src/landscape.rs): the exhaustive landscape a search is judged
against (e.g. examples/landscapes/dgemm.json). A long sweep
appends each configuration to FILE.partial (JSON lines) as it finishes, and
a later run with the same FILE skips those: an interrupted sweep resumes.

Usage:
  deploy/sweep_vs_demo.py [--kernel DIR] [--jobs N] [--json] BINARY [BINARY...]
  deploy/sweep_vs_demo.py target/release/mtswarm
  deploy/sweep_vs_demo.py /tmp/mtswarm.before target/release/mtswarm
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def children_cpu():
    """User + system CPU seconds of every child process waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_demo(binary, kernel, extra):
    cpu0, t0 = children_cpu(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sweep-vs-demo-") as tmp:
        proc = subprocess.run(
            [binary, "demo", "--kernel", kernel, "--json",
             "--report", os.path.join(tmp, "report.html")] + extra,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"demo with {binary} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    by_status = out.get("candidates_by_status", {})
    ran = sum(v for k, v in by_status.items() if k not in ("pruned", "not_run"))
    return {
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "evaluations": ran,
        "best_gflops": out["best"]["gflops"],
        "best_params": out["best"]["params"],
        "time_to_best_seconds": out.get("time_to_best_seconds"),
        "time_to_first_result_seconds": out.get("time_to_first_result_seconds"),
    }


def configurations(binary, kernel):
    proc = subprocess.run([binary, "emu", "space", kernel],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"{binary} emu space {kernel} failed:\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def run_sweep(binary, kernel, jobs, configs, landscape, progress=None):
    t0 = time.monotonic()

    def one(config):
        args = [binary, "emu", "run", kernel, "--json"]
        for name, value in config.items():
            args += ["-D", f"{name}={value}"]
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        done = time.monotonic() - t0
        try:
            result = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return None, done, config
        ok = bool(result.get("valid") and not result.get("flags"))
        row = {"defines": config, "valid": ok,
               "seconds": result.get("seconds") if ok else None,
               "gflops": result.get("gflops") if ok else None}
        landscape.append(row)
        if progress is not None:
            progress.write(json.dumps(row) + "\n")
            progress.flush()
        return (result.get("gflops") if ok else None), done, config

    cpu0 = children_cpu()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, configs))
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    valid = [r for r in results if r[0] is not None]
    best = max(valid, key=lambda r: r[0]) if valid else (None, None, None)
    # When the sweep first had its best: the earliest finish of a
    # configuration with that figure.
    found = min((r[1] for r in valid if r[0] == best[0]), default=None)
    return {
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "evaluations": len(results),
        "valid": len(valid),
        "best_gflops": best[0],
        "best_params": best[2],
        "time_to_best_seconds": found,
    }


def kernel_tuner_cache(kernel, landscape):
    """The sweep as a Kernel Tuner cache file: parameters in tune.toml
    order, each entry on one line, `time` in milliseconds."""
    import tomllib
    with open(os.path.join(kernel, "tune.toml"), "rb") as f:
        params = tomllib.load(f).get("param", [])
    swept = set().union(*(r["defines"] for r in landscape)) if landscape else set()
    keys = [p["name"] for p in params if p["name"] in swept]

    def value(text):
        try:
            return int(text)
        except ValueError:
            return text

    cache = {}
    for row in landscape:
        entry = {k: value(row["defines"][k]) for k in keys}
        if row["valid"]:
            entry.update({"time": row["seconds"] * 1000.0, "GFLOP/s": row["gflops"]})
        else:
            entry.update({"time": "RuntimeFailedConfig", "__error__": "RuntimeFailedConfig"})
        cache[",".join(str(entry[k]) for k in keys)] = entry
    head = json.dumps({
        "device_name": "MT-3000 emulator",
        "kernel_name": os.path.basename(os.path.normpath(kernel)),
        "tune_params_keys": keys,
        "tune_params": {p["name"]: p["values"] for p in params if p["name"] in keys},
        "objective": "time",
    }, indent=1)[:-2]
    lines = [json.dumps(k) + ": " + json.dumps(v) for k, v in sorted(cache.items())]
    return head + ',\n "cache": {\n' + ",\n".join(lines) + "\n}\n}\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binaries", nargs="+",
                        help="mtswarm binaries to compare; an entry may carry demo arguments "
                             "after the path: 'target/debug/mtswarm --exact-timing=false'")
    parser.add_argument("--kernel", default="examples/kernels/dgemm")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="sweep processes at a time (default: nproc)")
    parser.add_argument("--demo-arg", action="append", default=[],
                        help="extra argument for `mtswarm demo` (repeatable)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object")
    parser.add_argument("--sweep-only", action="store_true",
                        help="run only the sweep of the first binary")
    parser.add_argument("--save-sweep", metavar="FILE",
                        help="write the sweep's per-configuration figures here (JSON)")
    args = parser.parse_args()

    if args.sweep_only:
        binary = args.binaries[0].split()[0]
        landscape, configs, progress = [], configurations(binary, args.kernel), None
        if args.save_sweep:
            partial = args.save_sweep + ".partial"
            if os.path.exists(partial):
                with open(partial) as done_file:
                    landscape = [json.loads(line) for line in done_file if line.strip()]
                done = {json.dumps(r["defines"], sort_keys=True) for r in landscape}
                configs = [c for c in configs if json.dumps(c, sort_keys=True) not in done]
                print(f"resuming: {len(landscape)} configurations done, {len(configs)} to go",
                      file=sys.stderr)
            progress = open(partial, "a")
        sweep = run_sweep(binary, args.kernel, args.jobs, configs, landscape, progress)
        print(json.dumps(sweep))
        if args.save_sweep:
            progress.close()
            with open(args.save_sweep, "w") as out:
                out.write(kernel_tuner_cache(args.kernel, landscape))
            os.remove(partial)
        return

    # The space as the last binary enumerates it (`emu space`), for all.
    configs = configurations(args.binaries[-1].split()[0], args.kernel)
    rows = []
    for entry in args.binaries:
        binary, *extra = entry.split()
        demo = run_demo(binary, args.kernel, args.demo_arg + extra)
        sweep = run_sweep(binary, args.kernel, args.jobs, configs, [])
        rows.append({"binary": entry, "demo": demo, "sweep": sweep})

    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    print(f"kernel {args.kernel}, sweep with {args.jobs} processes")
    print(f"{'binary':<34} {'run':<6} {'wall s':>8} {'to best s':>10} {'CPU s':>8} "
          f"{'evals':>6} {'CPU/eval':>9} {'best GFLOPS':>12}")
    for row in rows:
        for name in ("demo", "sweep"):
            r = row[name]
            per = r["cpu_seconds"] / r["evaluations"] if r["evaluations"] else None
            print(f"{row['binary'][-34:]:<34} {name:<6} {fmt(r['wall_seconds'], '8.1f')} "
                  f"{fmt(r['time_to_best_seconds'], '10.1f')} {fmt(r['cpu_seconds'], '8.1f')} "
                  f"{r['evaluations']:>6} {fmt(per, '9.3f')} {fmt(r['best_gflops'], '12.1f')}")
        demo, sweep = row["demo"], row["sweep"]
        if demo["time_to_best_seconds"] is not None and sweep["wall_seconds"]:
            ratio = demo["time_to_best_seconds"] / sweep["wall_seconds"]
            row["demo_to_best_over_sweep_wall"] = ratio
            first = demo.get("time_to_first_result_seconds")
            if first is not None:
                print(f"{'':<34} demo: first result after {first:.1f} s (start-up)")
            print(f"{'':<34} demo time to best / sweep wall = {ratio:.2f} (target <= 0.3); "
                  f"demo best / sweep best = {demo['best_gflops'] / sweep['best_gflops']:.3f}")
    if args.json:
        print(json.dumps({"kernel": args.kernel, "jobs": args.jobs, "rows": rows}))


if __name__ == "__main__":
    main()
