//! The driver: replays a target's corpus, then mutates it for a time
//! budget, holding every input to the property (no panic, time and memory
//! bounds, the target's own checks). It counts executions, distinct
//! outcomes (the distinct [`Outcome::signature`]s: the stand-in for code
//! coverage, which stable Rust does not give a running process) and
//! failures, and writes each failing input to a directory so it can join
//! the corpus. An input that yields an outcome not seen before joins the
//! pool the mutations draw from, so the search follows new behaviour.

use std::cell::RefCell;
use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Checked, Outcome, Target, Violation, alloc, mutate};

/// Most inputs the mutations draw from.
const MAX_POOL: usize = 10_000;

/// How a target is run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// How long to mutate after the corpus is replayed.
    pub duration: Duration,
    /// The seed of the mutations.
    pub seed: u64,
    /// Where failing inputs are written (`<dir>/<target>/<hash>`).
    pub failures_dir: PathBuf,
    /// Longest one input may take before it is a failure.
    pub slow: Duration,
    /// Longest one input may take before the process is stopped (a hang:
    /// the input is written first).
    pub hang: Duration,
    /// Most bytes one input may make the process hold.
    pub memory_limit: usize,
    /// Where inputs with a new outcome are written, to grow the corpus.
    pub save_new: Option<PathBuf>,
    /// Writes each input to `<failures_dir>/<target>/current` before it
    /// runs, so one that kills the process (a stack overflow) is kept.
    pub keep_current: bool,
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target.
    pub target: &'static str,
    /// Inputs in its corpus.
    pub corpus_inputs: usize,
    /// Inputs run (the corpus's and the generated ones).
    pub executions: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Distinct outcomes seen.
    pub distinct_outcomes: usize,
    /// Inputs accepted into a value.
    pub accepted: u64,
    /// The slowest input's time.
    pub slowest: Duration,
    /// The most bytes one input made the process hold.
    pub peak_bytes: usize,
    /// Inputs that broke the property.
    pub failures: Vec<Failure>,
}

impl Report {
    /// Executions per second.
    pub fn rate(&self) -> f64 {
        self.executions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// One input that broke the property.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Where the input was written.
    pub input: PathBuf,
    /// What went wrong.
    pub what: String,
}

thread_local! {
    /// The message of a panic inside a check (`Some` while a check runs).
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Records panics inside checks instead of printing them; others print as
/// before.
fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let inside = PANIC.with(|p| {
                let mut slot = p.borrow_mut();
                match slot.as_mut() {
                    Some(message) => {
                        *message = info.to_string();
                        true
                    }
                    None => false,
                }
            });
            if !inside {
                previous(info);
            }
        }));
    });
}

/// The input a check is running on and since when, for the watchdog.
type Running = Arc<Mutex<Option<(Instant, Vec<u8>)>>>;

/// Stops the process when one input runs past `hang`, after writing it.
fn watchdog(target: &'static str, running: Running, config: &RunConfig) -> impl FnOnce() + use<> {
    let hang = config.hang;
    let dir = config.failures_dir.clone();
    let stop = Arc::new(Mutex::new(false));
    let stop_flag = stop.clone();
    let handle = std::thread::spawn(move || {
        loop {
            std::thread::park_timeout(Duration::from_millis(200));
            if stop_flag.lock().map(|s| *s).unwrap_or(true) {
                return;
            }
            let stuck = running.lock().ok().and_then(|r| {
                r.as_ref()
                    .filter(|(t, _)| t.elapsed() > hang)
                    .map(|(_, i)| i.clone())
            });
            if let Some(input) = stuck {
                let path = save(&dir, target, &input);
                eprintln!(
                    "fuzz {target}: an input ran over {hang:?} (a hang); it is in {}",
                    path.display()
                );
                std::process::abort();
            }
        }
    });
    move || {
        if let Ok(mut s) = stop.lock() {
            *s = true;
        }
        handle.thread().unpark();
        let _ = handle.join();
    }
}

/// Runs one input: its check, with panics caught and the bounds applied.
fn execute(
    target: &Target,
    input: &[u8],
    config: &RunConfig,
    running: &Running,
) -> (Checked, Duration, usize) {
    if let Ok(mut r) = running.lock() {
        *r = Some((Instant::now(), input.to_vec()));
    }
    PANIC.with(|p| *p.borrow_mut() = Some(String::new()));
    let held = alloc::start();
    let started = Instant::now();
    let result = panic::catch_unwind(AssertUnwindSafe(|| (target.check)(input)));
    let took = started.elapsed();
    let peak = alloc::peak_above(held);
    let message = PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default();
    if let Ok(mut r) = running.lock() {
        *r = None;
    }
    let checked = match result {
        Err(_) => Err(Violation(format!("panic: {message}"))),
        Ok(_) if took > config.slow => Err(Violation(format!(
            "took {took:?} (at most {:?})",
            config.slow
        ))),
        Ok(_) if peak > config.memory_limit => Err(Violation(format!(
            "held {peak} bytes (at most {})",
            config.memory_limit
        ))),
        Ok(checked) => checked,
    };
    (checked, took, peak)
}

/// Replays `target`'s corpus, then mutates it for `config.duration`.
pub fn run(target: &Target, config: &RunConfig) -> Report {
    install_panic_hook();
    let mut corpus = read_corpus(&crate::corpus_dir(target.name));
    corpus.extend((target.seeds)());
    let mut report = Report {
        target: target.name,
        corpus_inputs: corpus.len(),
        executions: 0,
        elapsed: Duration::ZERO,
        distinct_outcomes: 0,
        accepted: 0,
        slowest: Duration::ZERO,
        peak_bytes: 0,
        failures: Vec::new(),
    };
    let running: Running = Arc::new(Mutex::new(None));
    let stop_watchdog = watchdog(target.name, running.clone(), config);
    let mut seen: HashSet<String> = HashSet::new();
    let mut pool: Vec<Vec<u8>> = if corpus.is_empty() {
        vec![Vec::new()]
    } else {
        corpus.clone()
    };
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut replay = corpus.into_iter();
    // The budget starts once the corpus is replayed.
    let mut deadline: Option<Instant> = None;
    loop {
        let input = match replay.next() {
            Some(input) => input,
            None if *deadline.get_or_insert_with(|| Instant::now() + config.duration)
                <= Instant::now() =>
            {
                break;
            }
            None => {
                let base = &pool[rng.random_range(0..pool.len())];
                let other = &pool[rng.random_range(0..pool.len())];
                mutate::mutate(&mut rng, base, other, target.dictionary, target.max_len)
            }
        };
        if config.keep_current {
            let dir = config.failures_dir.join(target.name);
            let kept = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join("current"), &input));
            if let Err(e) = kept {
                eprintln!("fuzz {}: cannot keep the current input: {e}", target.name);
            }
        }
        let (checked, took, peak) = execute(target, &input, config, &running);
        report.executions += 1;
        report.slowest = report.slowest.max(took);
        report.peak_bytes = report.peak_bytes.max(peak);
        match checked {
            Ok(Outcome {
                accepted,
                signature,
            }) => {
                report.accepted += u64::from(accepted);
                if seen.insert(signature) && pool.len() < MAX_POOL {
                    if let Some(dir) = &config.save_new {
                        save(dir, target.name, &input);
                    }
                    pool.push(input);
                }
            }
            Err(Violation(what)) => {
                let path = save(&config.failures_dir, target.name, &input);
                report.failures.push(Failure { input: path, what });
            }
        }
    }
    stop_watchdog();
    report.elapsed = started.elapsed();
    report.distinct_outcomes = seen.len();
    report
}

/// The inputs of a corpus directory, in name order (none when it is
/// missing).
fn read_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p| p.is_file());
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// Writes `input` to `<dir>/<target>/<hash>` and returns the path.
fn save(dir: &Path, target: &str, input: &[u8]) -> PathBuf {
    let mut hasher = DefaultHasher::new();
    input.hash(&mut hasher);
    let dir = dir.join(target);
    let path = dir.join(format!("{:016x}", hasher.finish()));
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input)) {
        eprintln!("fuzz {target}: cannot write {}: {e}", path.display());
    }
    path
}
