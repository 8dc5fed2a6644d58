//! The harness protocol (stdout lines, see `examples/kernels/README.md`):
//! `MTSWARM_EMU {json}` per `hthread_group_wait` (from the runtime),
//! `MTSWARM_RESULT {json}` per kernel execution (from the harness, read as
//! every backend reads it: `crate::harness_line`) and `MTSWARM_ERROR {json}`
//! when the runtime stops the program (capacity exceeded, API misuse).
//! Reading them is where emulated figures meet the plausibility bounds.

use serde::Deserialize;

use super::Flavor;
use crate::board::{Counters, RunOutcome, RunSample};
use crate::error::HwError;
use crate::harness_line::{HarnessLine, ResultLine};
use crate::plausibility::{self, ModelFigures};
use crate::process::{excerpt, tail};
use crate::spec::ChipSpec;

/// Longest message of a `MTSWARM_ERROR` line kept (its end).
const MAX_MESSAGE_CHARS: usize = 1000;

#[derive(Debug, Deserialize)]
struct EmuLine {
    threads: u32,
    #[serde(default)]
    kernel_cycles: f64,
    #[serde(default)]
    flops: f64,
    #[serde(default)]
    dma_bytes: f64,
    #[serde(default)]
    ddr_bytes: f64,
    #[serde(default)]
    stall_cycles: f64,
    #[serde(default)]
    wall_seconds: f64,
}

#[derive(Debug, Deserialize)]
struct ErrorLine {
    kind: String,
    message: String,
}

/// One execution's figures before they become a [`RunSample`].
#[derive(Debug, Default)]
struct Pending {
    cycles: f64,
    wall: f64,
    threads: u32,
    counters: Counters,
}

fn to_u64(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x.round() as u64
    } else {
        0
    }
}

/// Turn the harness's stdout into a [`RunOutcome`]. A runtime error of kind
/// `capacity` is an `Err(HwError::Capacity)` (the configuration cannot run on
/// the chip); `launch` is `HwError::Launch`; others make the outcome invalid.
pub(crate) fn parse_output(
    stdout: &str,
    spec: &ChipSpec,
    flavor: Flavor,
    model: Option<ModelFigures>,
) -> Result<RunOutcome, HwError> {
    let mut reading = Reading {
        spec,
        flavor,
        model,
        outcome: RunOutcome::default(),
        pending: Pending::default(),
        last_rate: (0.0, 0.0),
    };
    for line in stdout.lines() {
        match HarnessLine::of(line) {
            Some(HarnessLine::Emu(json)) => reading.add_group_wait(json)?,
            Some(HarnessLine::Result(json)) => reading.close_execution(ResultLine::parse(json)),
            Some(HarnessLine::Error(json)) => reading.runtime_stopped(json)?,
            // The harness's own timing: the emulator's figures replace it.
            Some(HarnessLine::Time(_)) | None => {}
        }
    }
    Ok(reading.finish())
}

/// The outcome read so far, line by line.
struct Reading<'a> {
    spec: &'a ChipSpec,
    flavor: Flavor,
    model: Option<ModelFigures>,
    outcome: RunOutcome,
    /// The figures of the execution whose result line is still to come.
    pending: Pending,
    /// GFLOPS and peak fraction of the last sample.
    last_rate: (f64, f64),
}

impl Reading<'_> {
    /// A `MTSWARM_EMU` line: its figures add to the pending execution.
    fn add_group_wait(&mut self, json: &str) -> Result<(), HwError> {
        let emu: EmuLine = serde_json::from_str(json).map_err(|e| {
            HwError::launch_caused(
                excerpt(&format!("bad MTSWARM_EMU line ({e}): {}", tail(json, 200))),
                e,
            )
        })?;
        for (field, value) in [
            ("kernel_cycles", emu.kernel_cycles),
            ("wall_seconds", emu.wall_seconds),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(HwError::launch(format!(
                    "bad MTSWARM_EMU line: {field} is {value}, not a count"
                )));
            }
        }
        let pending = &mut self.pending;
        pending.cycles += emu.kernel_cycles;
        pending.wall += emu.wall_seconds;
        pending.threads = pending.threads.max(emu.threads);
        // The runtime's figures are the kernel process's output: their sum
        // saturates rather than overflows.
        let counters = &mut pending.counters;
        counters.flops = counters.flops.saturating_add(to_u64(emu.flops));
        counters.dma_bytes = counters.dma_bytes.saturating_add(to_u64(emu.dma_bytes));
        counters.ddr_bytes = counters.ddr_bytes.saturating_add(to_u64(emu.ddr_bytes));
        counters.stall_cycles = counters
            .stall_cycles
            .saturating_add(to_u64(emu.stall_cycles));
        Ok(())
    }

    /// A `MTSWARM_RESULT` line: the pending figures become a sample, held to
    /// the chip's bounds when emulated.
    fn close_execution(&mut self, result: ResultLine) {
        let done = std::mem::take(&mut self.pending);
        // The harness's own count is the kernel's output: a negative or
        // non-finite one counts as no work claimed.
        let flops = result
            .flops
            .filter(|f| f.is_finite() && *f >= 0.0)
            .unwrap_or(0.0);
        // Useful work: the model's, else the harness's count.
        let useful = self
            .model
            .map(|m| m.flops)
            .filter(|f| *f > 0.0)
            .unwrap_or(flops);
        let (modeled_cycles, seconds) = match self.flavor {
            Flavor::Emulated => (Some(to_u64(done.cycles)), done.cycles / self.spec.clock_hz),
            Flavor::Native => (None, done.wall),
        };
        let valid = result.valid && result.error.is_none() && done.threads > 0;
        let error = if valid {
            None
        } else if done.threads == 0 {
            Some("the harness reported a result without running the kernel".to_owned())
        } else {
            Some(
                result
                    .error
                    .unwrap_or_else(|| "output differs from the reference".to_owned()),
            )
        };
        self.last_rate = self.rate(useful, seconds, done.threads);
        let mut sample = RunSample {
            valid,
            error,
            modeled_cycles,
            seconds,
            max_abs_err: result.max_abs_err,
            counters: done.counters,
            seed: result.seed,
            useful_flops: to_u64(useful),
        };
        // Wall-clock figures of the host CPU are not the chip's: only
        // emulated figures are held to the chip's bounds.
        if self.flavor == Flavor::Emulated {
            let bounds = plausibility::Bounds {
                spec: self.spec,
                cores: done.threads,
                model: self.model,
                counted_flops: true,
            };
            let flags = plausibility::flags_of(&sample, flops, &bounds);
            plausibility::apply(&mut sample, &flags);
            plausibility::collect(&mut self.outcome, &[flags]);
        }
        self.outcome.samples.push(sample);
    }

    /// GFLOPS and peak fraction of `useful` flops in `seconds` on `threads`
    /// cores (no peak fraction for the host CPU's figures).
    fn rate(&self, useful: f64, seconds: f64, threads: u32) -> (f64, f64) {
        let rate = useful / seconds;
        // A kernel's claimed work over a tiny time can overflow: no rate
        // then, rather than an infinite one.
        if seconds > 0.0 && rate.is_finite() && rate >= 0.0 {
            // A launch that reports no cores has no peak to be a fraction of.
            let peak = match (self.flavor, self.spec.peak_flops(threads)) {
                (Flavor::Emulated, peak) if peak > 0.0 => rate / peak,
                _ => 0.0,
            };
            (rate / 1e9, peak)
        } else {
            (0.0, 0.0)
        }
    }

    /// A `MTSWARM_ERROR` line: an error of the run, or an invalid outcome.
    fn runtime_stopped(&mut self, json: &str) -> Result<(), HwError> {
        let err: ErrorLine = serde_json::from_str(json).map_err(|e| {
            HwError::launch_caused(
                excerpt(&format!(
                    "bad MTSWARM_ERROR line ({e}): {}",
                    tail(json, 200)
                )),
                e,
            )
        })?;
        // The kernel's words: bounded like every other excerpt of its output.
        let message = match err.message.trim() {
            "" => format!(
                "the emulator runtime stopped the program ({} error, no message)",
                tail(&err.kind, 40)
            ),
            message => tail(message, MAX_MESSAGE_CHARS),
        };
        match err.kind.as_str() {
            "capacity" => Err(HwError::Capacity(message)),
            "launch" => Err(HwError::launch(message)),
            "config" => Err(HwError::Config(message)),
            _ => {
                self.outcome.valid = false;
                self.outcome.error = Some(message);
                Ok(())
            }
        }
    }

    /// The outcome: the last sample's figures, valid when every sample is.
    fn finish(self) -> RunOutcome {
        let mut outcome = self.outcome;
        if let Some(last) = outcome.samples.last() {
            outcome.modeled_cycles = last.modeled_cycles;
            outcome.seconds = last.seconds;
            outcome.counters = last.counters;
            outcome.max_abs_err = last.max_abs_err;
            outcome.gflops = self.last_rate.0;
            outcome.peak_fraction = self.last_rate.1;
        }
        if outcome.error.is_none() {
            outcome.valid = !outcome.samples.is_empty() && outcome.samples.iter().all(|s| s.valid);
            outcome.error = outcome
                .samples
                .iter()
                .find_map(|s| s.error.clone())
                .or_else(|| {
                    outcome
                        .samples
                        .is_empty()
                        .then(|| "no MTSWARM_RESULT line".to_owned())
                });
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_pairs_runtime_lines_with_results() {
        let spec = ChipSpec::default();
        let out = "MTSWARM_EMU {\"kernel\":\"k\",\"threads\":2,\"kernel_cycles\":1200,\"flops\":192000,\"dma_bytes\":8,\"stall_cycles\":3,\"wall_seconds\":0.1}\n\
                   MTSWARM_RESULT {\"valid\":true,\"max_abs_err\":0.0,\"flops\":192000,\"error\":null}\n";
        let o = parse_output(out, &spec, Flavor::Emulated, None).expect("parses");
        assert!(o.valid);
        assert_eq!(o.modeled_cycles, Some(1200));
        assert!((o.seconds - 1e-6).abs() < 1e-15);
        // 192000 flops in 1 us = 192 GFLOPS; 2 cores peak 2 * 96 * 1.2e9.
        assert!((o.gflops - 192.0).abs() < 1e-9);
        assert!((o.peak_fraction - 192e9 / spec.peak_flops(2)).abs() < 1e-12);
        assert_eq!(o.counters.dma_bytes, 8);
    }

    #[test]
    fn capacity_error_line_becomes_capacity_error() {
        let out = "MTSWARM_ERROR {\"kind\":\"capacity\",\"message\":\"AM capacity exceeded\"}\n";
        let err = parse_output(out, &ChipSpec::default(), Flavor::Emulated, None).unwrap_err();
        assert_eq!(err, HwError::Capacity("AM capacity exceeded".into()));
    }

    #[test]
    fn a_kernel_s_lines_are_quoted_in_part_and_its_figures_checked() {
        let spec = ChipSpec::default();
        let long = "x".repeat(50_000);
        let out = format!("MTSWARM_EMU {{\"threads\": {long}\n");
        let err = parse_output(&out, &spec, Flavor::Emulated, None).unwrap_err();
        assert!(
            err.to_string().len() < 1_000,
            "{} bytes",
            err.to_string().len()
        );
        let out = format!("MTSWARM_ERROR {{\"kind\":\"capacity\",\"message\":\"{long}\"}}\n");
        let err = parse_output(&out, &spec, Flavor::Emulated, None).unwrap_err();
        assert!(
            err.to_string().len() < 1_200,
            "{} bytes",
            err.to_string().len()
        );
        let out = "MTSWARM_ERROR {\"kind\":\"capacity\",\"message\":\" \"}\n";
        let err = parse_output(out, &spec, Flavor::Emulated, None).unwrap_err();
        assert!(
            err.to_string().contains("capacity error, no message"),
            "{err}"
        );
        let out = "MTSWARM_EMU {\"threads\":1,\"wall_seconds\":-1}\n";
        let err = parse_output(out, &spec, Flavor::Native, None).unwrap_err();
        assert!(err.to_string().contains("wall_seconds is -1"), "{err}");
    }

    #[test]
    fn huge_figures_saturate_and_a_mistyped_field_is_quoted_in_part() {
        let spec = ChipSpec::default();
        let line = "MTSWARM_EMU {\"threads\":1,\"kernel_cycles\":10,\"ddr_bytes\":1e19}\n";
        let out = format!("{line}{line}MTSWARM_RESULT {{\"valid\":true}}\n");
        let o = parse_output(&out, &spec, Flavor::Emulated, None).expect("parses");
        assert_eq!(o.counters.ddr_bytes, u64::MAX);
        let out = format!("MTSWARM_EMU {{\"threads\":\"{}\"}}\n", "7".repeat(30_000));
        let err = parse_output(&out, &spec, Flavor::Emulated, None).unwrap_err();
        assert!(
            err.to_string().len() < 1_000,
            "{} bytes",
            err.to_string().len()
        );
    }

    #[test]
    fn an_overflowing_rate_and_a_padded_message_are_refused() {
        let spec = ChipSpec::default();
        let out = "MTSWARM_EMU {\"threads\":1,\"wall_seconds\":1e-300}\n\
                   MTSWARM_RESULT {\"valid\":true,\"flops\":1e308}\n";
        let o = parse_output(out, &spec, Flavor::Native, None).expect("parses");
        assert!(o.gflops.is_finite(), "{}", o.gflops);
        let out = format!(
            "MTSWARM_ERROR {{\"kind\":\"capacity\",\"message\":\"AM full{}\"}}\n",
            " ".repeat(5_000)
        );
        let err = parse_output(&out, &spec, Flavor::Emulated, None).unwrap_err();
        assert_eq!(err.to_string(), "AM full");
    }
}
