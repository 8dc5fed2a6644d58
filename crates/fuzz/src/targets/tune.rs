//! A kernel's `tune.toml` (`crates/hw/src/tune/`): the space, its
//! constraint and `[model]` expressions, and `-D` defines checked against
//! it. The input is the file; lines after `#%defines` (a TOML comment) are
//! `NAME=VALUE` defines to check. What the space says about itself must
//! agree: each configuration it lists passes its own checks, as do its
//! defines, and its model's figures are finite.

use std::collections::BTreeMap;

use mtswarm_hw::{ChipSpec, TuneSpace};

use crate::{Checked, Outcome, Target, Violation, refused_with};

pub(super) const TARGET: Target = Target {
    name: "tune",
    about: "tune.toml, constraint and [model] expressions, -D defines (crates/hw/src/tune)",
    check,
    dictionary: &[
        b"[[param]]\nname = \"MB\"\nvalues = [32, 64]\ndefault = 32\n",
        b"constraints = [\"MB % 8 == 0\"]\n",
        b"[model]\nflops = \"2 * N\"\nbytes = \"8 * N / MB\"\n",
        b"[sizes]\nN = 1024\n",
        b"baseline = { MB = 16 }\n",
        b"range = { start = 1, end = 64, step = 0 }\n",
        b"\n#%defines\nMB=64\n",
        b" / 0",
        b" % 0",
        b"**",
        b"am_bytes",
        b"vector_lanes",
        b"kernel = \"k\"\n",
        b"tolerance = 1e-9\n",
        b"1e308",
    ],
    seeds: crate::no_seeds,
    max_len: 16 * 1024,
};

/// Longest error accepted (an error lists the known names at most).
const MAX_ERROR_BYTES: usize = 8192;
/// Spaces listed in full (the listing is bounded by the crate's own
/// limit; this keeps each input fast).
const MAX_LISTED: usize = 4096;

fn check(input: &[u8]) -> Checked {
    let text = String::from_utf8_lossy(input);
    let (toml, defines) = match text.split_once("#%defines") {
        Some((toml, defines)) => (toml, Some(defines)),
        None => (text.as_ref(), None),
    };
    let space = match TuneSpace::from_toml_str(toml) {
        Ok(space) => space,
        Err(e) => return refused_with(&e.to_string(), MAX_ERROR_BYTES),
    };
    let spec = ChipSpec::default();
    let mut signature = format!("space {} params", space.params.len().min(4));
    if space.cartesian_size() <= MAX_LISTED {
        match space.configurations(&spec) {
            Ok(configs) => {
                signature.push_str(&format!(", {} configs", configs.len().min(3)));
                for config in configs.iter().take(64) {
                    agrees(&space, config, &spec)?;
                }
            }
            Err(e) => {
                signature.push_str(&format!(
                    ", list: {}",
                    refused_with(&e.to_string(), MAX_ERROR_BYTES)?.signature
                ));
            }
        }
    }
    let Some(defines) = defines else {
        return Ok(Outcome::accepted(signature));
    };
    let defines: BTreeMap<String, String> = defines
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect();
    match space.check_defines(&defines, &spec) {
        Ok(()) => {
            model(&space, &defines, &spec)?;
            Ok(Outcome::accepted(format!("{signature}, defines ok")))
        }
        Err(e) => {
            let refused = refused_with(&e.to_string(), MAX_ERROR_BYTES)?;
            Ok(Outcome::refused(format!(
                "{signature}, defines: {}",
                refused.signature
            )))
        }
    }
}

/// A configuration the space lists passes the space's checks, and so do
/// the defines it becomes.
fn agrees(
    space: &TuneSpace,
    config: &mtswarm_hw::tune::Config,
    spec: &ChipSpec,
) -> Result<(), Violation> {
    space.check(config, spec).map_err(|e| {
        Violation(format!(
            "a listed configuration fails the space's check: {e} ({config:?})"
        ))
    })?;
    let defines = space.defines(config);
    space.check_defines(&defines, spec).map_err(|e| {
        Violation(format!(
            "a listed configuration's defines fail: {e} ({defines:?})"
        ))
    })?;
    model(space, &defines, spec)
}

/// The model's figures are finite, or an error.
fn model(
    space: &TuneSpace,
    defines: &BTreeMap<String, String>,
    spec: &ChipSpec,
) -> Result<(), Violation> {
    match space.model_figures(defines, spec) {
        Ok(Some((flops, bytes))) if !(flops.is_finite() && bytes.is_finite()) => Err(Violation(
            format!("model figures flops={flops} bytes={bytes} for {defines:?}"),
        )),
        Ok(_) => Ok(()),
        Err(e) => refused_with(&e.to_string(), MAX_ERROR_BYTES).map(|_| ()),
    }
}
