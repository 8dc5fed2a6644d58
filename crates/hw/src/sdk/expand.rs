//! Placeholder expansion: a command template and one step's values become
//! the argument vector that step runs (no shell, so values cannot inject
//! commands).

use std::collections::BTreeMap;
use std::path::Path;

use super::config::SdkConfig;
use crate::board::Slice;

/// Values the placeholders expand to for one command.
pub(crate) struct Expansion<'a> {
    pub(crate) config: &'a SdkConfig,
    pub(crate) slice: &'a Slice,
    pub(crate) kernel_dir: &'a Path,
    pub(crate) out_dir: &'a Path,
    pub(crate) defines: &'a BTreeMap<String, String>,
    pub(crate) cores: u32,
    pub(crate) runs: u32,
    pub(crate) args: &'a [String],
}

impl Expansion<'_> {
    fn root_dir(&self, sub: &str) -> String {
        match &self.config.sdk_root {
            Some(root) => format!("{}/", root.join(sub).display()),
            None => String::new(),
        }
    }

    fn inline(&self, key: &str) -> String {
        match key {
            "bin" => self.root_dir("bin"),
            "lib" => self.root_dir("lib"),
            "sdk" => self
                .config
                .sdk_root
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            "kernel_dir" => self.kernel_dir.display().to_string(),
            "out_dir" => self.out_dir.display().to_string(),
            "program" => self.out_dir.join("host").display().to_string(),
            "cores" => self.cores.to_string(),
            "runs" => self.runs.to_string(),
            "cluster" => self.slice.cluster.unwrap_or(0).to_string(),
            "board" => self.slice.board.clone(),
            "host" => self.config.host.clone().unwrap_or_default(),
            _ => String::new(),
        }
    }

    fn list(&self, key: &str) -> Option<Vec<String>> {
        Some(match key {
            "defines" => self
                .defines
                .iter()
                .map(|(k, v)| {
                    if v.is_empty() {
                        format!("-D{k}")
                    } else {
                        format!("-D{k}={v}")
                    }
                })
                .collect(),
            "includes" => {
                let mut out: Vec<String> = self
                    .config
                    .include_dirs
                    .iter()
                    .map(|d| format!("-I{}", d.display()))
                    .collect();
                if let Some(root) = &self.config.sdk_root {
                    out.push(format!("-I{}", root.join("include").display()));
                }
                out
            }
            "libdirs" => self
                .config
                .sdk_root
                .iter()
                .map(|root| format!("-L{}", root.join("lib").display()))
                .collect(),
            "launch_prefix" => self.config.launch_prefix.clone(),
            "args" => self.args.to_vec(),
            _ => return None,
        })
    }

    pub(crate) fn expand(&self, template: &[String]) -> Vec<String> {
        let mut argv = Vec::with_capacity(template.len() + 8);
        for token in template {
            if let Some(key) = token.strip_prefix('{').and_then(|t| t.strip_suffix('}'))
                && let Some(values) = self.list(key)
            {
                argv.extend(values);
                continue;
            }
            let mut out = String::with_capacity(token.len());
            let mut rest = token.as_str();
            while let Some(open) = rest.find('{') {
                out.push_str(&rest[..open]);
                let after = &rest[open + 1..];
                match after.find('}') {
                    Some(close) => {
                        out.push_str(&self.inline(&after[..close]));
                        rest = &after[close + 1..];
                    }
                    None => {
                        out.push_str(&rest[open..]);
                        rest = "";
                    }
                }
            }
            out.push_str(rest);
            argv.push(out);
        }
        argv
    }
}
