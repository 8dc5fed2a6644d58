//! The observability assets as the tests read them: the Grafana dashboard's
//! Prometheus queries (panel by panel), the metric names a query reads, and
//! a real Prometheus (Debian's `prometheus` package, `deploy/setup.sh`)
//! started on a free loopback port and asked with `promtool query instant`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::process::NodeProcess;

/// Where the tools come from when they are missing.
pub const PROMETHEUS_HINT: &str =
    "run `bash deploy/setup.sh` (it installs Debian's prometheus package: prometheus and promtool)";

/// The dashboard Grafana provisions (`deploy/observability`).
pub fn dashboard_path() -> PathBuf {
    crate::repo_root().join("deploy/observability/grafana/dashboards/mtswarm.json")
}

/// One Prometheus query of a dashboard panel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PanelQuery {
    /// The panel's title.
    pub panel: String,
    /// The target's refId.
    pub ref_id: String,
    /// The PromQL expression as Grafana runs it.
    pub expr: String,
}

/// Every Prometheus query of the dashboard at `path` (rows' nested panels
/// included; targets of other data sources, such as the traces table, are
/// not PromQL and left out).
pub fn dashboard_queries(path: &Path) -> Vec<PanelQuery> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let dashboard: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut queries = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("the dashboard has panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested.iter());
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let source = if target["datasource"].is_object() {
                &target["datasource"]
            } else {
                &panel["datasource"]
            };
            if source["type"].as_str() != Some("prometheus") {
                continue;
            }
            queries.push(PanelQuery {
                panel: panel["title"].as_str().unwrap_or_default().to_string(),
                ref_id: target["refId"].as_str().unwrap_or_default().to_string(),
                expr: target["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("a Prometheus target without expr: {target}"))
                    .to_string(),
            });
        }
    }
    queries.sort_by(|a, b| (&a.panel, &a.ref_id).cmp(&(&b.panel, &b.ref_id)));
    queries
}

/// `expr` with Grafana's interval variables replaced by `window`, as an
/// instant query outside Grafana needs it.
pub fn instant_expr(expr: &str, window: &str) -> String {
    [
        "${__rate_interval}",
        "$__rate_interval",
        "${__interval}",
        "$__interval",
        "${__range}",
        "$__range",
    ]
    .iter()
    .fold(expr.to_string(), |text, variable| {
        text.replace(variable, window)
    })
}

/// PromQL words that are not metric names.
const KEYWORDS: [&str; 12] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
];

/// The metric names `expr` reads: identifiers that are not functions,
/// aggregations, keywords, label names (in `by (...)`, matchers) or numbers.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // Label lists after these words are label names, not metrics.
    let mut label_list_next = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '{' || c == '[' {
            let close = if c == '{' { '}' } else { ']' };
            while i < chars.len() && chars[i] != close {
                i += 1;
            }
            i += 1;
        } else if c == '(' && label_list_next {
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            i += 1;
            label_list_next = false;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric()
                    || chars[i] == '.'
                    || (matches!(chars[i], '+' | '-') && matches!(chars[i - 1], 'e' | 'E')))
            {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let lower = word.to_ascii_lowercase();
            let next_word: String = chars[next..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
                .collect();
            // `sum by (le) (...)`: an aggregation with its grouping first.
            let grouped_aggregation = matches!(next_word.as_str(), "by" | "without");
            if grouped_aggregation {
                // An aggregation operator; its label list follows.
            } else if matches!(
                lower.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            ) {
                label_list_next = true;
            } else if chars.get(next) == Some(&'(') || KEYWORDS.contains(&lower.as_str()) {
                // A function or aggregation call, or a keyword.
            } else {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// `GET` of a daemon's `http://HOST:PORT/metrics`: the body of a 200
/// answer, or what went wrong.
pub fn scrape(url: &str) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url} is not an http:// URL"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = std::net::TcpStream::connect(host).map_err(|e| format!("{url}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{url}: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("{url}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{url}: no HTTP header: {response}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{url}: {head}"));
    }
    Ok(body.to_string())
}

/// Finds `program` on PATH; panics with [`PROMETHEUS_HINT`] when it is not.
pub fn require_tool(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH: {PROMETHEUS_HINT}"))
}

/// A Prometheus server of the test's own, on a free loopback port with a
/// temporary store; killed when dropped (the package's service, if any,
/// plays no part).
pub struct Prometheus {
    process: NodeProcess,
    url: String,
    promtool: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Writes `config` (a prometheus.yml) and starts `prometheus` on it;
    /// waits at most `timeout` until it answers a query.
    pub fn start(config: &str, timeout: Duration) -> Prometheus {
        let prometheus = require_tool("prometheus");
        let promtool = require_tool("promtool");
        let dir = tempfile::Builder::new()
            .prefix("mtswarm-prometheus-")
            .tempdir()
            .expect("Prometheus directory");
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let check = Command::new(&promtool)
            .args(["check", "config"])
            .arg(&config_path)
            .output()
            .expect("run promtool check config");
        assert!(
            check.status.success(),
            "promtool refuses the test's configuration: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut command = Command::new(prometheus);
        command
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let process = NodeProcess::spawn("prometheus", command).expect("start prometheus");
        let server = Prometheus {
            process,
            url: format!("http://127.0.0.1:{port}"),
            promtool,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + timeout;
        while server.query("vector(1)").is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "Prometheus did not answer within {timeout:?}:\n{}",
                server.process.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `promtool query instant URL EXPR -o json`: the result's samples, or
    /// promtool's complaint.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let output = Command::new(&self.promtool)
            .args(["query", "instant", "-o", "json", &self.url, expr])
            .output()
            .map_err(|e| format!("promtool could not be run: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "promtool query instant {expr:?}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&output.stdout);
        match serde_json::from_str::<Value>(text.trim()) {
            Ok(Value::Array(samples)) => Ok(samples),
            Ok(Value::Null) => Ok(Vec::new()),
            Ok(other) => Ok(vec![other]),
            Err(error) => Err(format!("promtool printed no JSON ({error}): {text}")),
        }
    }

    /// Prometheus's own log, for assertion messages.
    pub fn log(&self) -> String {
        self.process.stderr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_skip_functions_labels_and_numbers() {
        let names = metric_names(
            "histogram_quantile(0.9, sum by (le, gen_ai_request_model) (rate(gen_ai_client_operation_duration_seconds_bucket{job=\"x\"}[5m]))) / clamp_min(sum without (slice_id) (rate(mtswarm_x_total[1m])), 1e-9) + on(a) group_left(b) mtswarm_y + max by(x)(mtswarm_z)",
        );
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            vec![
                "gen_ai_client_operation_duration_seconds_bucket".to_string(),
                "mtswarm_x_total".to_string(),
                "mtswarm_y".to_string(),
                "mtswarm_z".to_string()
            ]
        );
    }

    #[test]
    fn interval_variables_become_the_window() {
        assert_eq!(
            instant_expr("rate(x[$__rate_interval]) + rate(y[${__range}])", "2m"),
            "rate(x[2m]) + rate(y[2m])"
        );
    }
}
