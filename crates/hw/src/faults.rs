//! Fault injection for the emulator: a farm operator (or a chaos test) makes
//! a slice hang, crash or give wrong answers at configured rates, to see the
//! worker's quarantine and the leader's reassignment work without real
//! broken hardware. Configured per board or per slice in `fleet.toml` (see
//! [`crate::fleet`]); off unless configured.
//!
//! Each launch of a harness on a faulty slice draws, in this order: `hang`
//! (the harness never finishes and is killed by the run timeout, reported as
//! [`crate::error::HwError::Timeout`]), else `crash` (the harness dies from
//! SIGSEGV), else `wrong` (every buffer the kernel writes is corrupted, so
//! the harness's answer check fails). The draws are independent uniform
//! numbers derived from sha256 over (seed, slice id, launch number, fault
//! kind): the same seed gives the same sequence of faults on the same slice,
//! whatever else runs in the process.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Fault rates of one slice: probabilities per launch in `0..=1`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FaultConfig {
    /// Probability that a launch hangs until the run timeout kills it.
    pub hang: f64,
    /// Probability that the harness dies from SIGSEGV.
    pub crash: f64,
    /// Probability that every buffer the kernel writes is corrupted.
    pub wrong: f64,
    /// Seed of the per-launch draws.
    pub seed: u64,
}

/// The keys a `faults` table may hold.
pub const FAULT_KEYS: &[&str] = &["hang", "crash", "wrong", "seed"];

/// Why a `faults` table was refused; each names where it stands (`owner`)
/// and the key involved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultsError {
    /// `faults` is not a table.
    #[error(
        "{owner}: `faults` must be a table like {{ hang = 0.1, crash = 0.1, wrong = 0.1, seed = 7 }}"
    )]
    NotATable {
        /// Where the table stands, e.g. "board `emu0`".
        owner: String,
    },
    /// A rate that is not a number.
    #[error("{owner}: faults.{key} must be a number in 0..=1, got {got}")]
    NotARate {
        /// Where the table stands.
        owner: String,
        /// `hang`, `crash` or `wrong`.
        key: String,
        /// The value given, as TOML.
        got: String,
    },
    /// A rate outside `0..=1`.
    #[error("{owner}: faults.{key} = {rate} is out of range 0..=1 (a probability per launch)")]
    RateOutOfRange {
        /// Where the table stands.
        owner: String,
        /// `hang`, `crash` or `wrong`.
        key: String,
        /// The rate given.
        rate: f64,
    },
    /// A seed that is not a non-negative integer.
    #[error("{owner}: faults.seed must be a non-negative integer, got {got}")]
    BadSeed {
        /// Where the table stands.
        owner: String,
        /// The value given, as TOML.
        got: String,
    },
    /// A key other than those of [`FAULT_KEYS`].
    #[error("{owner}: unknown key faults.{key} (expected {keys})", keys = FAULT_KEYS.join(", "))]
    UnknownKey {
        /// Where the table stands.
        owner: String,
        /// The key given.
        key: String,
    },
}

/// What one launch suffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The harness never finishes; the run timeout kills it.
    Hang,
    /// The harness dies from SIGSEGV.
    Crash,
    /// Every buffer the kernel writes is corrupted, so the answer check fails.
    Wrong,
}

impl Fault {
    /// The value of `$MTSWARM_FAULT` the emulator runtime acts on.
    pub fn env_value(self) -> &'static str {
        match self {
            Self::Hang => "hang",
            Self::Crash => "crash",
            Self::Wrong => "wrong",
        }
    }
}

impl FaultConfig {
    /// True when no launch can fail.
    pub fn is_off(&self) -> bool {
        self.hang <= 0.0 && self.crash <= 0.0 && self.wrong <= 0.0
    }

    /// Parse a `faults` table; `owner` names where it stands in error
    /// messages (e.g. "board `emu0`, slice cluster 1").
    pub fn from_toml(value: &toml::Value, owner: &str) -> Result<Self, FaultsError> {
        let owner = || owner.to_owned();
        let toml::Value::Table(table) = value else {
            return Err(FaultsError::NotATable { owner: owner() });
        };
        let mut config = Self::default();
        for (key, value) in table {
            match key.as_str() {
                "hang" | "crash" | "wrong" => {
                    let rate = match value {
                        toml::Value::Float(f) => *f,
                        toml::Value::Integer(i) => *i as f64,
                        other => {
                            return Err(FaultsError::NotARate {
                                owner: owner(),
                                key: key.clone(),
                                got: other.to_string(),
                            });
                        }
                    };
                    if !(0.0..=1.0).contains(&rate) {
                        return Err(FaultsError::RateOutOfRange {
                            owner: owner(),
                            key: key.clone(),
                            rate,
                        });
                    }
                    match key.as_str() {
                        "hang" => config.hang = rate,
                        "crash" => config.crash = rate,
                        _ => config.wrong = rate,
                    }
                }
                "seed" => match value {
                    toml::Value::Integer(i) if *i >= 0 => config.seed = *i as u64,
                    other => {
                        return Err(FaultsError::BadSeed {
                            owner: owner(),
                            got: other.to_string(),
                        });
                    }
                },
                other => {
                    return Err(FaultsError::UnknownKey {
                        owner: owner(),
                        key: other.to_owned(),
                    });
                }
            }
        }
        Ok(config)
    }

    /// The fault of launch number `launch` (0-based) on `slice_id`.
    pub fn decide(&self, slice_id: &str, launch: u64) -> Option<Fault> {
        [
            (Fault::Hang, self.hang),
            (Fault::Crash, self.crash),
            (Fault::Wrong, self.wrong),
        ]
        .into_iter()
        .find(|(fault, rate)| *rate > 0.0 && self.draw(slice_id, launch, *fault) < *rate)
        .map(|(fault, _)| fault)
    }

    /// A uniform number in `[0, 1)` for one (slice, launch, fault kind).
    fn draw(&self, slice_id: &str, launch: u64, fault: Fault) -> f64 {
        let mut hash = Sha256::new();
        hash.update(self.seed.to_le_bytes());
        hash.update(slice_id.as_bytes());
        hash.update([0u8]);
        hash.update(launch.to_le_bytes());
        hash.update(fault.env_value().as_bytes());
        let digest = hash.finalize();
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        // 53 random bits: exactly representable, strictly below 1.
        (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The fault state of one emulated slice: its rates and its launch counter.
#[derive(Debug, Default)]
pub(crate) struct FaultInjector {
    config: FaultConfig,
    launches: AtomicU64,
}

impl FaultInjector {
    /// An injector drawing at these rates, its launch counter at 0.
    pub(crate) fn new(config: FaultConfig) -> Self {
        Self {
            config,
            launches: AtomicU64::new(0),
        }
    }

    /// The rates it draws against.
    pub(crate) fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// Count one launch and decide its fault.
    pub(crate) fn next_launch(&self, slice_id: &str) -> Option<Fault> {
        if self.config.is_off() {
            return None;
        }
        let launch = self.launches.fetch_add(1, Ordering::SeqCst);
        self.config.decide(slice_id, launch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_roughly_honoured() {
        let config = FaultConfig {
            crash: 0.25,
            seed: 3,
            ..FaultConfig::default()
        };
        let crashes = (0..4000)
            .filter(|&n| config.decide("b/c0", n) == Some(Fault::Crash))
            .count();
        assert!((800..1200).contains(&crashes), "{crashes} of 4000");
    }

    #[test]
    fn bad_tables_name_the_owner_and_key() {
        let value: toml::Value =
            toml::from_str::<toml::Table>("f = { crash = 1.5 }").expect("toml")["f"].clone();
        let error = FaultConfig::from_toml(&value, "board `x`")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("board `x`") && error.contains("faults.crash"),
            "{error}"
        );
    }
}
