//! Printing shared by the client commands: JSON, and the listings (`jobs`,
//! `approvals`, `quarantine list`) that print one object with `--json` and
//! a table for people otherwise.

use std::process::ExitCode;

use serde_json::{Value, json};

pub(super) fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// A listing of `items`: with `--json` the object `{json_key: [entry of
/// each item]}`; otherwise `empty` when there are none, or `header`, one
/// `row` per item and the `footer` (a hint what to do next), if any.
pub(super) struct Listing<'a, T> {
    pub(super) items: &'a [T],
    pub(super) json_key: &'static str,
    pub(super) entry: &'a dyn Fn(&T) -> Value,
    pub(super) empty: &'a str,
    pub(super) header: String,
    pub(super) row: &'a dyn Fn(&T) -> String,
    pub(super) footer: Option<&'static str>,
}

impl<T> Listing<'_, T> {
    /// Prints the listing as JSON (`json`) or as a table; the command's
    /// exit code (success: the leader answered).
    pub(super) fn print(&self, json: bool) -> ExitCode {
        if json {
            let entries: Vec<Value> = self.items.iter().map(self.entry).collect();
            print_json(&json!({ self.json_key: entries }));
            return ExitCode::SUCCESS;
        }
        if self.items.is_empty() {
            println!("{}", self.empty);
            return ExitCode::SUCCESS;
        }
        println!("{}", self.header);
        for item in self.items {
            println!("{}", (self.row)(item));
        }
        if let Some(footer) = self.footer {
            println!("{footer}");
        }
        ExitCode::SUCCESS
    }
}
