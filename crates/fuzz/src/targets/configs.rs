//! The files an operator or a test writes and the system reads: fleet.toml
//! (`crates/hw/src/fleet/`), slice selectors, the leader's price table
//! (`crates/leader/src/prices.rs`), the client configuration
//! (`crates/auth/src/client_config.rs`) and model cassettes
//! (`crates/llm/src/cassette.rs`). The input's first line names the kind,
//! the rest is the file. Each reader gives a value or an error of bounded
//! size naming the problem; a price table gives finite, non-negative
//! costs.

use std::cell::RefCell;
use std::path::Path;

use mtswarm_auth::ClientConfig;
use mtswarm_hw::{Fleet, SliceSelector};
use mtswarm_leader::PriceTable;
use mtswarm_llm::ReplayModel;

use crate::{Checked, Outcome, Target, Violation, refused_with};

pub(super) const TARGET: Target = Target {
    name: "configs",
    about: "fleet.toml, slice selectors, price tables, client config, cassettes (hw, leader, auth, llm)",
    check,
    dictionary: &[
        b"fleet\n",
        b"prices\n",
        b"client\n",
        b"cassette\n",
        b"selector\n",
        b"[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nslicing = \"per-cluster\"\n",
        b"slices = [{ cluster = 0, cores = 8 }]\n",
        b"[spec]\nclusters = 4\n",
        b"[prices.\"m\"]\nprompt_per_million = 0.1\ncompletion_per_million = 0.3\n",
        b"[profiles.farm]\nleader = \"https://leader:7443\"\n",
        b"backend=emulator,cores>=8",
        b"{\"seq\":1,\"model\":\"m\",\"request\":{\"messages\":[]},\"outcome\":{\"kind\":\"streamed\",\"events\":[]}}\n",
        b"-1e309",
    ],
    seeds: crate::no_seeds,
    max_len: 32 * 1024,
};

/// Longest error accepted.
const MAX_ERROR_BYTES: usize = 4096;

thread_local! {
    static DIR: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// `text` written to a file `name` in a scratch directory, then `read`.
fn from_file<T>(name: &str, text: &str, read: impl FnOnce(&Path) -> T) -> Result<T, Violation> {
    DIR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let dir =
                tempfile::tempdir().map_err(|e| Violation(format!("no scratch directory: {e}")))?;
            *slot = Some(dir);
        }
        let Some(dir) = slot.as_ref() else {
            return Err(Violation("no scratch directory".into()));
        };
        let path = dir.path().join(name);
        std::fs::write(&path, text).map_err(|e| Violation(format!("cannot write {name}: {e}")))?;
        Ok(read(&path))
    })
}

fn labelled<E: std::fmt::Display>(kind: &str, result: Result<String, E>) -> Checked {
    match result {
        Ok(what) => Ok(Outcome::accepted(format!("{kind}: {what}"))),
        Err(e) => refused_with(&e.to_string(), MAX_ERROR_BYTES)
            .map(|o| Outcome::refused(format!("{kind}: {}", o.signature))),
    }
}

fn prices(text: &str) -> Checked {
    let table = match PriceTable::parse(text, Path::new("prices.toml")) {
        Ok(table) => table,
        Err(e) => return labelled::<_>("prices", Err::<String, _>(e)),
    };
    for model in table.prices.keys() {
        if let Some(cost) = table.cost(model, 1_000_000, u64::MAX)
            && !(cost.is_finite() && cost >= 0.0)
        {
            return Err(Violation(format!(
                "the price table costs {model} at {cost}"
            )));
        }
    }
    Ok(Outcome::accepted(format!(
        "prices: {} models",
        table.prices.len().min(3)
    )))
}

fn check(input: &[u8]) -> Checked {
    let text = String::from_utf8_lossy(input);
    let (kind, body) = text.split_once('\n').unwrap_or((text.as_ref(), ""));
    match kind.trim() {
        "fleet" => labelled(
            "fleet",
            Fleet::from_toml_str(body, Path::new("/nonexistent"))
                .map(|f| format!("{} slices", f.slices().len().min(5))),
        ),
        "selector" => labelled(
            "selector",
            SliceSelector::parse(body).map(|s| format!("{} terms", s.terms().len().min(5))),
        ),
        "prices" => prices(body),
        "client" => labelled(
            "client",
            from_file("client.toml", body, ClientConfig::load)?
                .map(|c| format!("{} profiles", c.map_or(0, |c| c.profiles.len()).min(3))),
        ),
        "cassette" => labelled(
            "cassette",
            from_file("cassette.jsonl", body, |p| ReplayModel::from_file(p))?
                .map(|m| format!("{} turns", m.remaining().min(3))),
        ),
        _ => Ok(Outcome::refused("unknown kind")),
    }
}
