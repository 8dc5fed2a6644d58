#!/usr/bin/env python3
"""The example kernels' figures under two builds of mtswarm, side by side.

    python3 deploy/emulator_figures.py --before OLD/mtswarm --after NEW/mtswarm \
        [--before-kernels OLD_CHECKOUT/examples/kernels]

For every example kernel it runs `mtswarm emu run --json` with each binary,
interleaved (one configuration under one binary, then under the other, so
a noisy machine loads both alike): the tune.toml default and every
configuration of the smaller spaces (their best under each binary is the
"best" row), and for dgemm_gsm (2,205 configurations) the default and the
best of its recorded exhaustive sweep. Each binary builds the kernel
directories of its own checkout (`--before-kernels`, `--after-kernels`;
harnesses use the headers their binary embeds). It prints a Markdown table of modeled
cycles and GFLOPS before and after, with the ratio, and the host CPU each
binary spent per candidate (build and one execution: what a worker pays),
measured from the children's resource usage.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = ["vecadd", "spmv", "stencil2d", "dgemm", "dgemm_gsm"]
SWEEP = os.path.join(REPO, "examples/landscapes/dgemm_gsm.json")
MAX_SWEPT = 150


def configurations(binary, root, kernel):
    out = subprocess.run(
        [binary, "emu", "space", os.path.join(root, kernel)],
        check=True, capture_output=True, text=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run(binary, root, kernel, defines):
    """(result JSON, CPU seconds of the run's process tree)."""
    argv = [binary, "emu", "run", "--json", os.path.join(root, kernel)]
    for k, v in sorted(defines.items()):
        argv += ["-D", f"{k}={v}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result = {"valid": False, "error": proc.stderr.strip()[-300:]}
    return result, cpu


def best_of_sweep():
    """The fastest configuration of the recorded landscape (Kernel Tuner's
    cache format: `time` in ms, `__error__` on a failed one)."""
    with open(SWEEP) as f:
        sweep = json.load(f)
    keys = sweep["tune_params_keys"]
    timed = [e for e in sweep["cache"].values()
             if "__error__" not in e and isinstance(e.get("time"), (int, float))]
    best = min(timed, key=lambda e: e["time"])
    return {k: str(best[k]) for k in keys}


def label(defines):
    return " ".join(f"{k}={v}" for k, v in sorted(defines.items())) or "(defaults)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the earlier mtswarm binary")
    parser.add_argument("--after", required=True, help="the later mtswarm binary")
    examples = os.path.join(REPO, "examples/kernels")
    parser.add_argument("--before-kernels", default=examples)
    parser.add_argument("--after-kernels", default=examples)
    parser.add_argument("--kernels", nargs="*", default=KERNELS)
    args = parser.parse_args()
    binaries = {
        "before": (args.before, args.before_kernels),
        "after": (args.after, args.after_kernels),
    }
    cpu = {"before": [], "after": []}
    rows = []
    started = time.time()
    for kernel in args.kernels:
        if kernel == "dgemm_gsm":
            configs = [{}, best_of_sweep()]
        else:
            configs = [{}] + configurations(args.after, args.after_kernels, kernel)[:MAX_SWEPT]
        results = []
        for defines in configs:
            pair = {}
            for name, (binary, root) in binaries.items():
                result, seconds = run(binary, root, kernel, defines)
                pair[name] = result
                cpu[name].append(seconds)
            results.append((defines, pair))
            print(f"[{time.time() - started:6.0f} s] {kernel} {label(defines)}: "
                  f"{pair['before'].get('gflops')} -> {pair['after'].get('gflops')}",
                  file=sys.stderr)

        def best(name):
            valid = [r for r in results[1:] if r[1][name].get("valid")]
            return max(valid, key=lambda r: r[1][name]["gflops"]) if valid else None

        picked = [("default", results[0])]
        for name in ("before", "after"):
            b = best(name)
            if b is not None and all(b[0] != p[1][0] for p in picked):
                picked.append((f"best ({name})", b))
        if kernel == "dgemm_gsm":
            picked = [("default", results[0]), ("best (recorded sweep)", results[1])]
        for what, (defines, pair) in picked:
            rows.append((kernel, what, label(defines), pair["before"], pair["after"]))

    print("| kernel | configuration | | cycles before | cycles after | GFLOPS before | GFLOPS after | after / before |")
    print("|---|---|---|---|---|---|---|---|")
    for kernel, what, defines, before, after in rows:
        def cell(r, key):
            v = r.get(key)
            if not r.get("valid"):
                return "invalid"
            return f"{v:,.0f}" if key == "modeled_cycles" else f"{v:,.1f}"
        ratio = ""
        if before.get("valid") and after.get("valid") and before.get("gflops"):
            ratio = f"{after['gflops'] / before['gflops']:.3f}"
        print(f"| {kernel} | {what} | `{defines}` | {cell(before, 'modeled_cycles')} | "
              f"{cell(after, 'modeled_cycles')} | {cell(before, 'gflops')} | "
              f"{cell(after, 'gflops')} | {ratio} |")
    print()
    for name in ("before", "after"):
        runs = cpu[name]
        print(f"{name}: {len(runs)} candidates, {sum(runs):.1f} s CPU, "
              f"{sum(runs) / max(len(runs), 1):.2f} s CPU per candidate")
    if cpu["before"] and sum(cpu["before"]) > 0:
        print(f"CPU per candidate, after / before: {sum(cpu['after']) / sum(cpu['before']):.2f}")


if __name__ == "__main__":
    main()
