//! `mtswarm search replay FILE`: the builtin search replayed against a
//! recorded landscape in Kernel Tuner's cache format (one mtswarm's sweeps
//! write, or one Kernel Tuner wrote for any device), over one or many
//! seeds, with the figures a comparison with other tuners needs: the best
//! found at the budget as a share of the landscape's optimum, and when
//! (evaluations and parallel rounds) the search reached 95 % of it and the
//! optimum itself. The replay is `mtswarm_policy::replay`: the leader's
//! plan and the worker's search, the same code a job runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use comfy_table::Table;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use mtswarm_hw::ChipSpec;
use mtswarm_hw::landscape::Landscape;
use mtswarm_hw::tune::TuneSpace;
use mtswarm_policy::replay::{ReplayConfig, ReplayRun, median_evaluations_to, replay};
use serde_json::{Value, json};

/// `mtswarm search ...`: the builtin search outside a job.
#[derive(Debug, Subcommand)]
pub enum SearchCommand {
    /// Replay the builtin search against a recorded landscape (a Kernel
    /// Tuner cache file) and print how close it came, how fast.
    Replay(ReplayCmd),
}

/// Arguments of `mtswarm search replay`.
#[derive(Debug, Args)]
pub struct ReplayCmd {
    /// The landscape: a Kernel Tuner cache file (JSON).
    pub file: PathBuf,
    /// Agents of the job (its `num_agents`, each on its own slice);
    /// default: as many as the budget feeds on --slices slices.
    #[arg(long)]
    pub agents: Option<usize>,
    /// Free slices when --agents is not given.
    #[arg(long, default_value_t = 8)]
    pub slices: usize,
    /// Evaluations of the whole job: a count (`110`) or a share of the
    /// landscape (`5%`); default: the default share of the space.
    #[arg(long)]
    pub budget: Option<String>,
    /// Replay with seeds 1..=N (each shuffles the order of the agents'
    /// candidates); default: one replay in the leader's order.
    #[arg(long)]
    pub seeds: Option<u64>,
    /// The entry field to minimize (default: the file's objective, else `time`).
    #[arg(long)]
    pub objective: Option<String>,
    /// A kernel directory whose tune.toml `[model]` gives the roofline
    /// bounds the search ranks candidates by (its own kernels' landscapes).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// DSP cores the roofline is computed for.
    #[arg(long, default_value_t = 24)]
    pub cores: u32,
    /// Each agent searches alone: its model sees only its own results
    /// (default: one search per job, every agent's model fitted to all
    /// agents' results and pending points).
    #[arg(long)]
    pub alone: bool,
    /// Print one JSON object (every seed's best-so-far after each evaluation).
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
}

/// Runs `mtswarm search ...`.
pub(crate) fn search(command: SearchCommand) -> anyhow::Result<ExitCode> {
    match command {
        SearchCommand::Replay(cmd) => replay_command(&cmd),
    }
}

/// One seed's replay and the figures read off it.
struct SeedFigures {
    seed: Option<u64>,
    run: ReplayRun,
    best_share: f64,
    to_95: Option<(usize, usize)>,
    to_optimum: Option<(usize, usize)>,
}

fn replay_command(cmd: &ReplayCmd) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&cmd.file)
        .with_context(|| format!("reading {}", cmd.file.display()))?;
    let landscape = Landscape::from_kernel_tuner_json_with(&text, cmd.objective.as_deref())
        .with_context(|| format!("reading {}", cmd.file.display()))?;
    let optimum = landscape
        .optimum()
        .and_then(|e| e.outcome.seconds())
        .context("the landscape has no measured configuration")?;
    let budget = cmd
        .budget
        .as_deref()
        .map(|b| parse_budget(b, landscape.entries.len()))
        .transpose()?;
    let bound = match &cmd.kernel {
        Some(dir) => Some(roofline_of(dir, cmd.cores)?),
        None => None,
    };
    let seeds: Vec<Option<u64>> = match cmd.seeds {
        Some(0) => bail!("--seeds must be at least 1"),
        Some(n) => (1..=n).map(Some).collect(),
        None => vec![None],
    };
    let mut figures = Vec::with_capacity(seeds.len());
    for seed in seeds {
        let config = ReplayConfig {
            slices: cmd.agents.unwrap_or(cmd.slices),
            agents: cmd.agents,
            budget,
            seed,
            cores: cmd.cores,
            shared: !cmd.alone,
        };
        let run = replay(&landscape, &config, bound.as_deref()).context("replaying the search")?;
        figures.push(seed_figures(seed, run, optimum));
    }
    if cmd.json {
        println!("{}", json_of(cmd, &landscape, optimum, &figures));
    } else {
        print_table(cmd, &landscape, optimum, &figures);
    }
    Ok(ExitCode::SUCCESS)
}

fn seed_figures(seed: Option<u64>, run: ReplayRun, optimum: f64) -> SeedFigures {
    let reached = |share: f64| {
        run.rounds_to(optimum, share)
            .map(|round| (run.evaluations_by_round(round), round))
    };
    SeedFigures {
        seed,
        best_share: run.best().map_or(0.0, |b| optimum / b),
        to_95: reached(0.95),
        to_optimum: reached(1.0),
        run,
    }
}

/// `110` or `5%` (of `entries`, at least 1).
fn parse_budget(text: &str, entries: usize) -> anyhow::Result<usize> {
    let text = text.trim();
    if let Some(share) = text.strip_suffix('%') {
        let share: f64 = share
            .trim()
            .parse()
            .with_context(|| format!("--budget {text}: not a percentage"))?;
        if !(share > 0.0 && share <= 100.0) {
            bail!("--budget {text}: the share must be above 0 % and at most 100 %");
        }
        return Ok(((entries as f64 * share / 100.0).round() as usize).max(1));
    }
    match text.parse::<usize>() {
        Ok(0) | Err(_) => bail!("--budget {text}: expected a positive count or a share like 5%"),
        Ok(count) => Ok(count),
    }
}

type BoundFn = Box<dyn Fn(&BTreeMap<String, String>) -> Option<f64>>;

/// The roofline bound of a candidate from the kernel's tune.toml `[model]`.
fn roofline_of(dir: &std::path::Path, cores: u32) -> anyhow::Result<BoundFn> {
    let space = TuneSpace::load(dir).with_context(|| format!("reading {}", dir.display()))?;
    let spec = ChipSpec::default();
    Ok(Box::new(move |defines| {
        let (flops, bytes) = space.model_figures(defines, &spec).ok()??;
        Some(mtswarm_tools::estimate::roofline(&spec, flops, bytes, cores, None).bound_seconds)
    }))
}

fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

fn reached_text(reached: Option<(usize, usize)>) -> String {
    reached.map_or_else(
        || "never".to_owned(),
        |(evaluations, rounds)| format!("{evaluations} ({rounds} rounds)"),
    )
}

fn print_table(cmd: &ReplayCmd, landscape: &Landscape, optimum: f64, figures: &[SeedFigures]) {
    println!(
        "{}: {} configurations ({} measured), optimum {:.4e} s; agents {}, budget {}",
        cmd.file.display(),
        landscape.entries.len(),
        landscape.measured(),
        optimum,
        figures.first().map_or(0, |f| f.run.agents.len()),
        figures.first().map_or(0, |f| f.run.evaluations()),
    );
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "seed",
        "evaluations",
        "rounds",
        "builds",
        "best, % of optimum",
        "to 95 %: evaluations (rounds)",
        "to optimum: evaluations (rounds)",
    ]);
    for f in figures {
        table.add_row(vec![
            f.seed.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            f.run.evaluations().to_string(),
            f.run.rounds().to_string(),
            f.run.builds.to_string(),
            format!("{:.1}", f.best_share * 100.0),
            reached_text(f.to_95),
            reached_text(f.to_optimum),
        ]);
    }
    println!("{table}");
    if figures.len() > 1 {
        let mut shares: Vec<f64> = figures.iter().map(|f| f.best_share * 100.0).collect();
        let at_optimum = figures.iter().filter(|f| f.to_optimum.is_some()).count();
        let to_optimum: Vec<Option<usize>> = figures
            .iter()
            .map(|f| f.to_optimum.map(|(e, _)| e))
            .collect();
        let mut builds: Vec<f64> = figures.iter().map(|f| f.run.builds as f64).collect();
        println!(
            "median {:.1} % of the optimum; P(optimum) {:.2}; median evaluations to the optimum {}; median builds {}",
            median(&mut shares).unwrap_or(0.0),
            at_optimum as f64 / figures.len() as f64,
            median_evaluations_to(&to_optimum).map_or_else(|| "-".to_owned(), |m| m.to_string()),
            median(&mut builds).unwrap_or(0.0),
        );
    }
}

fn json_of(cmd: &ReplayCmd, landscape: &Landscape, optimum: f64, figures: &[SeedFigures]) -> Value {
    let reached = |r: Option<(usize, usize)>| {
        r.map_or(
            Value::Null,
            |(evaluations, rounds)| json!({"evaluations": evaluations, "rounds": rounds}),
        )
    };
    let runs: Vec<Value> = figures
        .iter()
        .map(|f| {
            let curve: Vec<Option<f64>> = (1..=f.run.evaluations())
                .map(|n| f.run.best_after(n))
                .collect();
            json!({
                "seed": f.seed,
                "agents": f.run.agents.len(),
                "evaluations": f.run.evaluations(),
                "rounds": f.run.rounds(),
                "builds": f.run.builds,
                "best_seconds": f.run.best(),
                "best_share_of_optimum": f.best_share,
                "to_95_percent": reached(f.to_95),
                "to_optimum": reached(f.to_optimum),
                "best_so_far_seconds": curve,
            })
        })
        .collect();
    json!({
        "file": cmd.file.display().to_string(),
        "kernel": landscape.kernel_name,
        "device": landscape.device_name,
        "configurations": landscape.entries.len(),
        "measured": landscape.measured(),
        "optimum_seconds": optimum,
        "runs": runs,
    })
}
