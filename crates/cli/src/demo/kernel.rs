//! The demo's kernel and fleet: a private copy of the kernel directory
//! with the `-D` overrides and the candidate limit applied to its
//! tune.toml, and the built-in emulator fleet.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::TuneSpace;

use super::DemoCmd;

/// Name of the tuning-space file in a kernel directory.
pub(super) const TUNE_FILE: &str = "tune.toml";

/// Copies the kernel directory to `<state>/kernels/<name>` and applies the
/// size overrides and the candidate limit to its tune.toml. Returns the
/// kernel root, the kernel's name and its (possibly reduced) space.
pub(super) fn prepare_kernel(
    cmd: &DemoCmd,
    state: &Path,
) -> anyhow::Result<(PathBuf, String, TuneSpace)> {
    let source = cmd
        .kernel
        .canonicalize()
        .with_context(|| format!("--kernel {} is not a directory", cmd.kernel.display()))?;
    let name = source
        .file_name()
        .and_then(|n| n.to_str())
        .context("--kernel must name a directory with a UTF-8 name")?
        .to_string();
    let root = state.join("kernels");
    let target = root.join(&name);
    copy_dir(&source, &target)?;
    let tune_path = target.join(TUNE_FILE);
    let text = std::fs::read_to_string(&tune_path)
        .with_context(|| format!("reading {}", source.join(TUNE_FILE).display()))?;
    let mut table: toml::Table = text
        .parse()
        .with_context(|| format!("parsing {}", source.join(TUNE_FILE).display()))?;
    for define in &cmd.defines {
        let (key, value) = define
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .with_context(|| format!("-D {define}: expected NAME=VALUE"))?;
        apply_define(&mut table, key.trim(), value.trim())?;
    }
    let spec = ChipSpec::default();
    let mut space = TuneSpace::from_toml_str(&toml::to_string(&table)?)
        .context("the tuning space after the -D overrides")?;
    let mut count = space
        .configurations(&spec)
        .context("enumerating the tuning space")?
        .len();
    if let Some(limit) = cmd.max_candidates {
        if limit == 0 {
            bail!("--max-candidates must be at least 1");
        }
        let names: Vec<String> = space.params.iter().map(|p| p.name.clone()).collect();
        for param in names.iter().rev() {
            if count <= limit {
                break;
            }
            let default = param_default(&table, param)?;
            apply_define(&mut table, param, &default)?;
            space = TuneSpace::from_toml_str(&toml::to_string(&table)?)?;
            count = space.configurations(&spec)?.len();
        }
    }
    if count == 0 {
        bail!(
            "the tuning space of {name} allows no configuration under its constraints (check the -D overrides)"
        );
    }
    std::fs::write(&tune_path, toml::to_string(&table)?)
        .with_context(|| format!("writing {}", tune_path.display()))?;
    Ok((root, name, space))
}

pub(super) fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let path = entry.path();
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&path, &dest)?;
        } else {
            std::fs::copy(&path, &dest).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

pub(super) fn toml_value(text: &str) -> toml::Value {
    match text.parse::<i64>() {
        Ok(number) => toml::Value::Integer(number),
        Err(_) => toml::Value::String(text.to_string()),
    }
}

/// A size gets the new value; a parameter is pinned to it.
pub(super) fn apply_define(table: &mut toml::Table, key: &str, value: &str) -> anyhow::Result<()> {
    if let Some(sizes) = table.get_mut("sizes").and_then(toml::Value::as_table_mut)
        && sizes.contains_key(key)
    {
        sizes.insert(key.to_string(), toml_value(value));
        return Ok(());
    }
    let params = table.get_mut("param").and_then(toml::Value::as_array_mut);
    let param = params.and_then(|params| {
        params
            .iter_mut()
            .filter_map(toml::Value::as_table_mut)
            .find(|p| p.get("name").and_then(toml::Value::as_str) == Some(key))
    });
    match param {
        Some(param) => {
            param.insert("values".into(), toml::Value::Array(vec![toml_value(value)]));
            param.insert("default".into(), toml_value(value));
            Ok(())
        }
        None => bail!("-D {key}={value}: {key} is neither a size nor a parameter of {TUNE_FILE}"),
    }
}

pub(super) fn param_default(table: &toml::Table, key: &str) -> anyhow::Result<String> {
    let value = table
        .get("param")
        .and_then(toml::Value::as_array)
        .and_then(|params| {
            params
                .iter()
                .filter_map(toml::Value::as_table)
                .find(|p| p.get("name").and_then(toml::Value::as_str) == Some(key))
        })
        .and_then(|p| p.get("default"))
        .with_context(|| format!("parameter {key} has no default in {TUNE_FILE}"))?;
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// The built-in fleet of the demo: `boards` emulated boards, `clusters`
/// whole-cluster slices each.
pub(super) fn fleet_toml(boards: u32, clusters: u32, spec: &ChipSpec) -> anyhow::Result<String> {
    if boards == 0 {
        bail!("--boards must be at least 1");
    }
    if clusters == 0 || clusters > spec.clusters {
        bail!(
            "--clusters must be between 1 and {} (clusters of the chip)",
            spec.clusters
        );
    }
    let slices: Vec<String> = (0..clusters)
        .map(|c| format!("{{ cluster = {c}, cores = {} }}", spec.cores_per_cluster))
        .collect();
    Ok((0..boards)
        .map(|b| {
            format!(
                "[[board]]\nid = \"board{b}\"\nbackend = \"emulator\"\nslices = [{}]\n",
                slices.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_hw::fleet::Fleet;

    #[test]
    fn the_fleet_has_the_requested_slices_and_rejects_impossible_ones() {
        let spec = ChipSpec::default();
        let text = fleet_toml(2, 3, &spec).expect("fleet");
        let fleet = Fleet::from_toml_str(&text, Path::new(".")).expect("valid fleet");
        assert_eq!(fleet.slices().len(), 6);
        assert!(fleet_toml(0, 1, &spec).is_err());
        assert!(fleet_toml(1, spec.clusters + 1, &spec).is_err());
    }

    #[test]
    fn defines_override_sizes_and_pin_parameters() {
        let mut table: toml::Table =
            "[sizes]\nM = 512\n[[param]]\nname = \"MB\"\nvalues = [32, 64]\ndefault = 64\n"
                .parse()
                .expect("toml");
        apply_define(&mut table, "M", "256").expect("size");
        apply_define(&mut table, "MB", "32").expect("param");
        assert_eq!(table["sizes"]["M"].as_integer(), Some(256));
        assert_eq!(
            table["param"][0]["values"].as_array().map(Vec::len),
            Some(1)
        );
        assert_eq!(table["param"][0]["default"].as_integer(), Some(32));
        assert!(apply_define(&mut table, "NOPE", "1").is_err());
    }
}
