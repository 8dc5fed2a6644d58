//! The sdk backend's configuration: the command templates of each build and
//! launch step, their placeholders and the limits and trees of the confined
//! steps, checked when loaded so a typo never reaches a build.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::HwError;
use crate::process::ProcessLimits;

fn tokens(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The command templates and environment of the real toolchain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SdkConfig {
    /// Root of the toolchain installation (`bin/`, `lib/`, `include/`).
    pub sdk_root: Option<PathBuf>,
    /// Extra directories `{includes}` passes as `-I` (before
    /// `<sdk_root>/include`); confined steps may read them.
    pub include_dirs: Vec<PathBuf>,
    /// Template compiling `kernel.c` for the DSP into `{out_dir}/kernel.o`.
    pub device_compile: Vec<String>,
    /// Template linking the device object into `{out_dir}/kernel.out`.
    pub device_link: Vec<String>,
    /// Template turning `kernel.out` into the loadable `{out_dir}/kernel.dat`.
    pub makedat: Vec<String>,
    /// Template building the host harness `{out_dir}/host`.
    pub host_compile: Vec<String>,
    /// Template of one launch of the harness (through `{launch_prefix}` when
    /// the board is on another host).
    pub launch: Vec<String>,
    /// `yhrun -p PART -w NODE`, `ssh HOST`, or empty (run on this host).
    pub launch_prefix: Vec<String>,
    /// The board host (fills `{host}`).
    pub host: Option<String>,
    /// Extra environment for every step (e.g. `PATH`, `LD_LIBRARY_PATH`).
    pub env: BTreeMap<String, String>,
    /// Time-out of each build step, seconds (0 counts as 1).
    pub build_timeout_seconds: u64,
    /// Resource limits of every step; a launch without `cpu_seconds` gets its
    /// timeout plus 5 s of CPU time.
    pub limits: ProcessLimits,
    /// Reported as the artifact's toolchain; default: the device compile
    /// command's program and flags.
    pub toolchain_label: Option<String>,
    /// Output kept per stream; the rest is drained and dropped.
    pub max_output_bytes: usize,
    /// Further trees the confined builds and local launches may read
    /// (besides the kernel directory, `sdk_root`, `include_dirs` and the
    /// system trees), e.g. a licence file.
    pub sandbox_read: Vec<PathBuf>,
    /// Paths a local launch may also write, e.g. the board's device nodes.
    pub sandbox_write: Vec<PathBuf>,
}

impl Default for SdkConfig {
    fn default() -> Self {
        Self {
            sdk_root: None,
            include_dirs: Vec::new(),
            device_compile: tokens(&[
                "{bin}MT-3000-gcc",
                "-c",
                "-O2",
                "-fenable-m3000",
                "-ffunction-sections",
                "-flax-vector-conversions",
                "{includes}",
                "{defines}",
                "{kernel_dir}/kernel.c",
                "-o",
                "{out_dir}/kernel.o",
            ]),
            device_link: tokens(&[
                "{bin}MT-3000-ld",
                "--gc-sections",
                "-T",
                "{lib}dsp.lds",
                "{out_dir}/kernel.o",
                "{lib}libhthread_device.a",
                "{lib}vlib3000.a",
                "{lib}slib3000.a",
                "-o",
                "{out_dir}/kernel.out",
            ]),
            makedat: tokens(&["{bin}MT-3000-makedat", "-J", "{out_dir}/kernel.out"]),
            host_compile: tokens(&[
                "gcc",
                "-O2",
                "{includes}",
                "{defines}",
                "{kernel_dir}/host.c",
                "-o",
                "{out_dir}/host",
                "{libdirs}",
                "-lhthread_host",
                "-lpthread",
            ]),
            launch: tokens(&[
                "{launch_prefix}",
                "env",
                "MTSWARM_CLUSTER={cluster}",
                "MTSWARM_CORES={cores}",
                "{program}",
                "--runs",
                "{runs}",
                "{args}",
            ]),
            launch_prefix: Vec::new(),
            host: None,
            env: BTreeMap::new(),
            build_timeout_seconds: 300,
            limits: ProcessLimits::default(),
            toolchain_label: None,
            max_output_bytes: 4 << 20,
            sandbox_read: Vec::new(),
            sandbox_write: Vec::new(),
        }
    }
}

pub(crate) const INLINE_PLACEHOLDERS: &[&str] = &[
    "bin",
    "lib",
    "sdk",
    "kernel_dir",
    "out_dir",
    "program",
    "cores",
    "runs",
    "cluster",
    "board",
    "host",
];
pub(crate) const LIST_PLACEHOLDERS: &[&str] =
    &["defines", "includes", "libdirs", "launch_prefix", "args"];

impl SdkConfig {
    /// Parse from TOML (unknown keys are errors).
    pub fn from_toml_str(text: &str) -> Result<Self, HwError> {
        let config: Self =
            toml::from_str(text).map_err(|e| HwError::Config(format!("sdk config: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Check templates: non-empty, only known placeholders.
    pub fn validate(&self) -> Result<(), HwError> {
        let steps = [
            ("device_compile", &self.device_compile),
            ("device_link", &self.device_link),
            ("makedat", &self.makedat),
            ("host_compile", &self.host_compile),
            ("launch", &self.launch),
        ];
        for (name, template) in steps {
            if template.is_empty() {
                return Err(HwError::Config(format!(
                    "sdk config: template `{name}` is empty"
                )));
            }
            for token in template {
                if LIST_PLACEHOLDERS
                    .iter()
                    .any(|p| token == &format!("{{{p}}}"))
                {
                    continue;
                }
                let mut rest = token.as_str();
                while let Some(open) = rest.find('{') {
                    let after = &rest[open + 1..];
                    let Some(close) = after.find('}') else {
                        return Err(HwError::Config(format!(
                            "sdk config: template `{name}`: unclosed `{{` in `{token}`"
                        )));
                    };
                    let key = &after[..close];
                    if !INLINE_PLACEHOLDERS.contains(&key) {
                        let hint = if LIST_PLACEHOLDERS.contains(&key) {
                            " (list placeholders must be a whole argument)"
                        } else {
                            ""
                        };
                        return Err(HwError::Config(format!(
                            "sdk config: template `{name}`: unknown placeholder `{{{key}}}` in `{token}`{hint}"
                        )));
                    }
                    rest = &after[close + 1..];
                }
            }
        }
        if self.max_output_bytes == 0 {
            return Err(HwError::Config(
                "sdk config: max_output_bytes must be positive".into(),
            ));
        }
        Ok(())
    }
}
