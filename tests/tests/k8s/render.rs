//! Rendering the kustomizations with the real `kubectl kustomize` (once per
//! test binary) and looking objects up in what it printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use mtswarm_tests::repo_root;
use yaml_rust2::{Yaml, YamlLoader};

/// Where the tools come from when they are missing.
pub(crate) const SETUP_HINT: &str =
    "run `bash deploy/setup.sh` (it installs kubectl and kubernetes-validate)";

pub(crate) fn k8s() -> PathBuf {
    repo_root().join("k8s")
}

/// Every overlay directory (`k8s/overlays/*` with a kustomization.yaml).
pub(crate) fn overlays() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(k8s().join("overlays"))
        .expect("k8s/overlays")
        .map(|entry| entry.expect("entry").path())
        .filter(|dir| dir.join("kustomization.yaml").is_file())
        .collect();
    dirs.sort();
    let names: Vec<String> = dirs.iter().map(|d| name_of(d)).collect();
    for expected in ["local", "production"] {
        assert!(
            names.iter().any(|n| n == expected),
            "overlay {expected} missing: {names:?}"
        );
    }
    dirs
}

/// The last path component (an overlay's name).
pub(crate) fn name_of(dir: &Path) -> String {
    dir.file_name()
        .and_then(|n| n.to_str())
        .expect("directory name")
        .to_string()
}

/// Runs a tool, failing the test with a clear message when it is missing.
pub(crate) fn run_tool(program: &str, args: &[&str]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} could not be run ({e}): {SETUP_HINT}"))
}

/// `kubectl kustomize DIR` of the base and every overlay, keyed by name
/// (`base`, `local`, `production`, ...); rendered once.
pub(crate) fn rendered() -> &'static BTreeMap<String, String> {
    static RENDERED: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    RENDERED.get_or_init(|| {
        let mut dirs = vec![k8s().join("base")];
        dirs.extend(overlays());
        dirs.iter()
            .map(|dir| {
                let output = run_tool("kubectl", &["kustomize", &dir.display().to_string()]);
                assert!(
                    output.status.success(),
                    "kubectl kustomize {} failed: {}",
                    dir.display(),
                    String::from_utf8_lossy(&output.stderr)
                );
                let text = String::from_utf8(output.stdout).expect("UTF-8 output");
                (name_of(dir), text)
            })
            .collect()
    })
}

/// The objects `kubectl kustomize` printed for `name`.
pub(crate) fn objects(name: &str) -> Vec<Yaml> {
    let text = rendered()
        .get(name)
        .unwrap_or_else(|| panic!("no rendering of {name}"));
    YamlLoader::load_from_str(text)
        .unwrap_or_else(|e| panic!("{name}: rendered YAML does not parse: {e}"))
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The overlays' names.
pub(crate) fn overlay_names() -> Vec<String> {
    overlays().iter().map(|d| name_of(d)).collect()
}

pub(crate) fn find<'a>(objects: &'a [Yaml], kind: &str, name: &str) -> &'a Yaml {
    objects
        .iter()
        .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The generated ConfigMap whose name starts with `prefix-` (kustomize
/// appends a content hash).
pub(crate) fn config_map<'a>(objects: &'a [Yaml], prefix: &str) -> &'a Yaml {
    objects
        .iter()
        .find(|o| {
            o["kind"].as_str() == Some("ConfigMap")
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&format!("{prefix}-")))
        })
        .unwrap_or_else(|| panic!("no ConfigMap {prefix}-<hash>"))
}

/// Objects of `kind` whose `app.kubernetes.io/name` label is `app`.
pub(crate) fn of_app<'a>(objects: &'a [Yaml], kind: &str, app: &str) -> Vec<&'a Yaml> {
    objects
        .iter()
        .filter(|o| {
            o["kind"].as_str() == Some(kind)
                && o["metadata"]["labels"]["app.kubernetes.io/name"].as_str() == Some(app)
        })
        .collect()
}

/// The pod spec of a workload.
pub(crate) fn pod(object: &Yaml) -> &Yaml {
    &object["spec"]["template"]["spec"]
}

pub(crate) fn container(object: &Yaml) -> &Yaml {
    &pod(object)["containers"][0]
}

/// The value of a container's plain `env` entry.
pub(crate) fn env_value(object: &Yaml, name: &str) -> Option<String> {
    container(object)["env"]
        .as_vec()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .and_then(|e| e["value"].as_str().map(str::to_string))
}

/// The `fieldPath` a container's `env` entry takes from the downward API.
pub(crate) fn env_field(object: &Yaml, name: &str) -> Option<String> {
    container(object)["env"]
        .as_vec()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .and_then(|e| {
            e["valueFrom"]["fieldRef"]["fieldPath"]
                .as_str()
                .map(str::to_string)
        })
}

/// A container's `args` as strings.
pub(crate) fn args(object: &Yaml) -> Vec<String> {
    container(object)["args"]
        .as_vec()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

/// One literal of the shared `mtswarm-config` ConfigMap.
pub(crate) fn config_value(objects: &[Yaml], key: &str) -> String {
    config_map(objects, "mtswarm-config")["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("mtswarm-config has no {key}"))
        .to_string()
}
