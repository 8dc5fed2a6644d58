//! The `simulated` board's settings in `fleet.toml`: how long an execution
//! takes, how many configurations answer wrongly and how much the figures
//! vary. Parsed here with the rest of the inventory (the backend itself is
//! [`crate::simulated`]), so a typo or an impossible value is refused when
//! the fleet loads, naming the board and the key.

use serde::Serialize;

use super::config_error;
use crate::error::HwError;

/// Settings of one `simulated` board (every slice of it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SimulatedSettings {
    /// Wall time of one kernel execution, milliseconds: drawn uniformly from
    /// `low..=high` per execution (equal ends: a fixed time). The run costs a
    /// timer, not host CPU.
    pub run_ms: (u64, u64),
    /// Share of the configurations (chosen deterministically from their
    /// defines) whose output is wrong, in `0..=1`.
    pub incorrect_fraction: f64,
    /// Relative spread of a measured time around the model's, in `0..0.1`:
    /// each execution's time is the model's times `1 ± noise`.
    pub noise: f64,
}

impl Default for SimulatedSettings {
    fn default() -> Self {
        Self {
            run_ms: DEFAULT_RUN_MS,
            incorrect_fraction: 0.0,
            noise: DEFAULT_NOISE,
        }
    }
}

/// `run_ms` when a simulated board does not say.
pub const DEFAULT_RUN_MS: (u64, u64) = (5, 20);
/// `noise` when a simulated board does not say.
pub const DEFAULT_NOISE: f64 = 0.005;
/// The largest `noise`: more would let the model's best drown in it.
const MAX_NOISE: f64 = 0.1;
/// The longest execution a simulated board accepts (10 minutes).
const MAX_RUN_MS: u64 = 600_000;

/// The raw keys of a board table that belong to the simulated backend.
#[derive(Debug, Default)]
pub(super) struct RawSimulated<'a> {
    pub(super) run_ms: Option<&'a toml::Value>,
    pub(super) incorrect_fraction: Option<&'a toml::Value>,
    pub(super) noise: Option<&'a toml::Value>,
}

impl RawSimulated<'_> {
    fn given(&self) -> Vec<&'static str> {
        [
            ("run_ms", self.run_ms.is_some()),
            ("incorrect_fraction", self.incorrect_fraction.is_some()),
            ("noise", self.noise.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect()
    }

    /// The settings of board `id`: `None` for a board of another backend
    /// (which may not give these keys), the defaults where a simulated
    /// board leaves a key out.
    pub(super) fn settings(
        &self,
        id: &str,
        simulated: bool,
    ) -> Result<Option<SimulatedSettings>, HwError> {
        if !simulated {
            let given = self.given();
            if let Some(key) = given.first() {
                return Err(config_error(format!(
                    "board `{id}`: `{key}` is only supported on simulated boards"
                )));
            }
            return Ok(None);
        }
        let mut settings = SimulatedSettings::default();
        if let Some(value) = self.run_ms {
            settings.run_ms = run_ms(id, value)?;
        }
        if let Some(value) = self.incorrect_fraction {
            settings.incorrect_fraction = number(id, "incorrect_fraction", value, 0.0, 1.0)?;
        }
        if let Some(value) = self.noise {
            settings.noise = number(id, "noise", value, 0.0, MAX_NOISE)?;
        }
        Ok(Some(settings))
    }
}

fn millis(id: &str, value: &toml::Value) -> Result<u64, HwError> {
    match value {
        toml::Value::Integer(ms) if (0..=MAX_RUN_MS as i64).contains(ms) => Ok(*ms as u64),
        other => Err(config_error(format!(
            "board `{id}`: run_ms: {other} is not a whole number of milliseconds in 0..={MAX_RUN_MS}"
        ))),
    }
}

fn run_ms(id: &str, value: &toml::Value) -> Result<(u64, u64), HwError> {
    match value {
        toml::Value::Array(ends) if ends.len() == 2 => {
            let (low, high) = (millis(id, &ends[0])?, millis(id, &ends[1])?);
            if low > high {
                return Err(config_error(format!(
                    "board `{id}`: run_ms = [{low}, {high}]: the low end exceeds the high end"
                )));
            }
            Ok((low, high))
        }
        toml::Value::Array(_) => Err(config_error(format!(
            "board `{id}`: run_ms = {value}: a range has exactly two ends, like [5, 20]"
        ))),
        single => millis(id, single).map(|ms| (ms, ms)),
    }
}

fn number(id: &str, key: &str, value: &toml::Value, low: f64, high: f64) -> Result<f64, HwError> {
    let number = match value {
        toml::Value::Float(f) => *f,
        toml::Value::Integer(i) => *i as f64,
        other => {
            return Err(config_error(format!(
                "board `{id}`: {key} = {other} is not a number"
            )));
        }
    };
    if !(low..=high).contains(&number) {
        return Err(config_error(format!(
            "board `{id}`: {key} = {number} is out of range {low}..={high}"
        )));
    }
    Ok(number)
}
