#!/usr/bin/env python3
"""mtswarm's search against the autotuners a performance engineer would
pick instead, on the same recorded landscapes and budgets (not part of CI).

Every landscape is a Kernel Tuner cache file (examples/landscapes/). For
each one and each budget (a share of its configurations), every strategy
runs once per seed:

- Kernel Tuner's strategies, in its own simulation mode on the cache file
  (`tune_kernel(..., simulation_mode=True, cache=FILE, seed=S)`), restricted
  to the configurations the file holds;
- Optuna's TPE sampler (and its GP sampler when torch is installed) over the
  same parameters, a configuration outside the file being no evaluation;
- mtswarm's builtin search: `mtswarm search replay FILE --agents 8
  --budget B --seeds S --json` (the leader's plan and each worker's search).

An evaluation is a distinct configuration measured (a failed one counts: it
cost a measurement), the first B of a run. Printed per landscape and
budget: median and P10/P90 of the best as % of the optimum, P(optimum),
P(>= 95 %), median evaluations to the optimum within the budget ("-" when
fewer than half the seeds reached it), and for mtswarm its parallel rounds.

The peers are installed from PyPI, pinned (deploy/bench/peers-requirements.txt),
into deploy/bench/.peers-venv on first use; the script then runs itself
there.

Usage:
  deploy/search_vs_peers.py [--seeds 30] [--budgets 2.5,5,10]
      [--strategies random_sample,bayes_opt,...] [--mtswarm target/release/mtswarm]
      [--json] [LANDSCAPE.json ...]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VENV = os.path.join(HERE, "bench", ".peers-venv")
REQUIREMENTS = os.path.join(HERE, "bench", "peers-requirements.txt")
DEFAULT_LANDSCAPES = [
    "examples/landscapes/dgemm_gsm.json",
    "examples/landscapes/dgemm.json",
    "examples/landscapes/spmv.json",
    "examples/landscapes/stencil2d.json",
    "examples/landscapes/kernel_tuner/pnpoly_rtx3090.json",
    "examples/landscapes/kernel_tuner/convolution_rtx3090.json",
]
KT_STRATEGIES = [
    "random_sample", "genetic_algorithm", "simulated_annealing", "diff_evo",
    "dual_annealing", "pso", "bayes_opt", "hybrid_vndx",
]
OPTUNA_STRATEGIES = ["optuna_tpe", "optuna_gp"]
AGENTS = 8


def in_venv():
    return os.path.realpath(sys.prefix) == os.path.realpath(VENV)


def ensure_venv():
    """Creates the pinned venv once and runs this script inside it."""
    if in_venv():
        return
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        print(f"installing Kernel Tuner and Optuna into {VENV} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "-r", REQUIREMENTS], check=True)
    os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


class Landscape:
    def __init__(self, path):
        self.path = path
        with open(path) as f:
            self.data = json.load(f)
        self.keys = self.data["tune_params_keys"]
        self.params = self.data["tune_params"]
        self.cache = self.data["cache"]
        self.objective = self.data.get("objective", "time")
        self.times = {}
        for key, entry in self.cache.items():
            value = entry.get(self.objective)
            ok = "__error__" not in entry and isinstance(value, (int, float)) and value > 0
            self.times[key] = float(value) if ok else None
        self.optimum = min(t for t in self.times.values() if t is not None)

    def key(self, config):
        return ",".join(str(config[k]) for k in self.keys)

    def budget(self, share):
        return max(1, round(len(self.cache) * share / 100.0))

    def kernel_dir(self):
        """The repository's kernel directory of an emulator landscape (its
        tune.toml [model] gives the roofline the search ranks by)."""
        name = self.data.get("kernel_name", "")
        path = os.path.join(REPO, "examples", "kernels", name)
        return path if os.path.exists(os.path.join(path, "tune.toml")) else None


def first_unique(landscape, configs, budget):
    """Times of the first `budget` distinct configurations of a run."""
    seen, trace = set(), []
    for config in configs:
        key = landscape.key(config)
        if key in seen or key not in landscape.times:
            continue
        seen.add(key)
        trace.append(landscape.times[key])
        if len(trace) == budget:
            break
    return trace


def kernel_tuner_run(landscape, strategy, budget, seed):
    from kernel_tuner import tune_kernel
    cache_keys = set(landscape.cache)

    def restrict(p):
        return landscape.key(p) in cache_keys

    from kernel_tuner.util import StopCriterionReached
    import numpy
    # At a budget of one or two evaluations some strategies (simulated
    # annealing) let Kernel Tuner's stop signal escape and lose the run:
    # such a run is repeated with a slightly larger budget and its first
    # `budget` distinct evaluations are kept.
    for extra in range(4):
        random.seed(seed)
        numpy.random.seed(seed)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results, _ = tune_kernel(
                    landscape.data.get("kernel_name", "kernel"), "/* recorded */",
                    landscape.data.get("problem_size") or 1, [], landscape.params,
                    restrictions=restrict, strategy=strategy,
                    strategy_options={"max_fevals": budget + extra},
                    cache=landscape.path, simulation_mode=True, quiet=True,
                    seed=seed, objective=landscape.objective)
        except StopCriterionReached:
            continue
        return first_unique(landscape, results, budget)
    raise RuntimeError(f"{strategy} stops at every budget from {budget} to {budget + 3}")


def optuna_run(landscape, strategy, budget, seed):
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if strategy == "optuna_gp":
        sampler = optuna.samplers.GPSampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(sampler=sampler)
    seen, trace = {}, []
    # A configuration outside the file is pruned (no evaluation); one seen
    # before answers from memory (no new evaluation).
    for _ in range(budget * 50):
        if len(trace) == budget:
            break
        trial = study.ask()
        config = {k: trial.suggest_categorical(k, landscape.params[k]) for k in landscape.keys}
        key = landscape.key(config)
        if key not in landscape.times:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        t = landscape.times[key]
        if key not in seen:
            seen[key] = t
            trace.append(t)
        study.tell(trial, t if t is not None else 1e30)
    return trace


def mtswarm_runs(landscape, budget, seeds, binary):
    args = [binary, "search", "replay", landscape.path, "--agents", str(AGENTS),
            "--budget", str(budget), "--seeds", str(seeds), "--json"]
    kernel = landscape.kernel_dir()
    if kernel:
        args += ["--kernel", kernel]
    out = subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True).stdout
    report = json.loads(out)
    traces, rounds = [], []
    for run in report["runs"]:
        # Best so far after each evaluation, seconds; the landscape's
        # objective is Kernel Tuner's milliseconds.
        traces.append([None if t is None else t * 1000.0 for t in run["best_so_far_seconds"]])
        reached = run["to_optimum"]
        rounds.append(reached["rounds"] if reached else None)
    return traces, rounds


def best_so_far(trace):
    best, out = None, []
    for t in trace:
        if t is not None and (best is None or t < best):
            best = t
        out.append(best)
    return out


def figures(landscape, curves, budget):
    optimum = landscape.optimum
    shares, reached = [], []
    for curve in curves:
        final = curve[min(budget, len(curve)) - 1] if curve else None
        shares.append(100.0 * optimum / final if final else 0.0)
        hit = next((i + 1 for i, b in enumerate(curve[:budget])
                    if b is not None and b <= optimum * (1 + 1e-12)), None)
        reached.append(hit)
    quantiles = (statistics.quantiles(shares, n=10, method="inclusive")
                 if len(shares) > 1 else [shares[0]] * 9)
    hits = sorted(r for r in reached if r is not None)
    median_hit = hits[(len(curves) - 1) // 2] if len(hits) * 2 > len(curves) else None
    return {
        "median": statistics.median(shares),
        "p10": quantiles[0],
        "p90": quantiles[-1],
        "p_optimum": sum(r is not None for r in reached) / len(curves),
        "p_95": sum(s >= 95.0 for s in shares) / len(curves),
        "median_evaluations_to_optimum": median_hit,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("landscapes", nargs="*", default=DEFAULT_LANDSCAPES)
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--budgets", default="2.5,5,10", help="shares of each space, %%")
    parser.add_argument("--strategies", default=",".join(KT_STRATEGIES + OPTUNA_STRATEGIES))
    parser.add_argument("--mtswarm", default=os.path.join(REPO, "target/release/mtswarm"))
    parser.add_argument("--json", action="store_true", help="also print one JSON object")
    args = parser.parse_args()
    ensure_venv()
    strategies = [s for s in args.strategies.split(",") if s]
    if "optuna_gp" in strategies:
        try:
            import torch  # noqa: F401  (Optuna's GP sampler needs it)
        except ImportError:
            print("optuna_gp skipped: Optuna's GP sampler needs torch "
                  f"({os.path.join(VENV, 'bin', 'pip')} install torch)", file=sys.stderr)
            strategies.remove("optuna_gp")
    everything = []
    for path in args.landscapes:
        landscape = Landscape(os.path.join(REPO, path) if not os.path.isabs(path) else path)
        for share in [float(b) for b in args.budgets.split(",")]:
            budget = landscape.budget(share)
            rows = []
            started = time.monotonic()
            mt_curves, mt_rounds = mtswarm_runs(landscape, budget, args.seeds, args.mtswarm)
            row = figures(landscape, mt_curves, budget)
            reached_rounds = sorted(r for r in mt_rounds if r is not None)
            row["rounds_to_optimum"] = (reached_rounds[(len(mt_rounds) - 1) // 2]
                                        if len(reached_rounds) * 2 > len(mt_rounds) else None)
            rows.append(("mtswarm (8 agents)", row))
            not_run = []
            for strategy in strategies:
                curves = []
                try:
                    for seed in range(1, args.seeds + 1):
                        if strategy.startswith("optuna"):
                            trace = optuna_run(landscape, strategy, budget, seed)
                        else:
                            trace = kernel_tuner_run(landscape, strategy, budget, seed)
                        curves.append(best_so_far(trace))
                except Exception as error:  # a peer that cannot run here is named, not fatal
                    not_run.append(f"{strategy}: {type(error).__name__}: {error}")
                    continue
                rows.append((strategy, figures(landscape, curves, budget)))
            print(f"\n### {os.path.relpath(landscape.path, REPO)}: {len(landscape.cache)} "
                  f"configurations, budget {budget} ({share:g} %), {args.seeds} seeds "
                  f"({time.monotonic() - started:.0f} s)\n")
            print("| strategy | median % of optimum | P10 / P90 | P(optimum) | P(>= 95 %) "
                  "| median evaluations to the optimum | rounds to the optimum |")
            print("|---|---|---|---|---|---|---|")
            for name, f in rows:
                hit = f["median_evaluations_to_optimum"]
                rounds = f.get("rounds_to_optimum")
                print(f"| {name} | {f['median']:.1f} | {f['p10']:.1f} / {f['p90']:.1f} "
                      f"| {f['p_optimum']:.2f} | {f['p_95']:.2f} | {hit if hit else '-'} "
                      f"| {rounds if rounds else ('-' if name.startswith('mtswarm') else '')} |")
            for line in not_run:
                print(f"\nnot run: {line}")
            sys.stdout.flush()
            everything.append({"landscape": path, "budget": budget, "share": share,
                               "seeds": args.seeds, "rows": dict(rows),
                               "not_run": not_run})
    if args.json:
        print(json.dumps(everything))


if __name__ == "__main__":
    main()
