//! Slice selectors: the leader's way of naming which slices of the fleet
//! a job may use (`backend=emulator,cores>=8`), parsed with errors that
//! name the term at fault.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::parse_backend;
use crate::board::{BackendKind, Slice};

/// Why a selector string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("slice selector `{}`: {}", crate::process::excerpt(.input), crate::process::excerpt(.reason))]
pub struct SelectorError {
    /// The selector text as given.
    pub input: String,
    /// What is wrong, naming the term at fault.
    pub reason: String,
}

/// A comparison operator of a selector term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOp {
    /// `=` (for `board` and `id`: the pattern matches).
    Eq,
    /// `!=`, the negation of `=`.
    Ne,
    /// `>=` (`cluster` and `cores` only).
    Ge,
    /// `<=` (`cluster` and `cores` only).
    Le,
    /// `>` (`cluster` and `cores` only).
    Gt,
    /// `<` (`cluster` and `cores` only).
    Lt,
}

impl SelectorOp {
    fn symbol(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "!=",
            Self::Ge => ">=",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Lt => "<",
        }
    }

    fn compare(self, left: u32, right: u32) -> bool {
        match self {
            Self::Eq => left == right,
            Self::Ne => left != right,
            Self::Ge => left >= right,
            Self::Le => left <= right,
            Self::Gt => left > right,
            Self::Lt => left < right,
        }
    }
}

/// One `key op value` condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorTerm {
    /// `backend=`: the slice's backend kind.
    Backend {
        /// `=` or `!=`.
        op: SelectorOp,
        /// The backend compared with.
        backend: BackendKind,
    },
    /// `board=` / `id=` take a pattern where `*` matches any run of characters.
    Board {
        /// `=` or `!=`.
        op: SelectorOp,
        /// Board id pattern.
        pattern: String,
    },
    /// `id=` (also spelled `slice=`): the slice id, e.g. `board0/c1`.
    Id {
        /// `=` or `!=`.
        op: SelectorOp,
        /// Slice id pattern.
        pattern: String,
    },
    /// `cluster=whole` matches whole-board slices.
    Cluster {
        /// Any operator for a number, `=` or `!=` for `whole`; a whole-board
        /// slice matches only `!=` a number.
        op: SelectorOp,
        /// The cluster number; `None` for `whole`.
        cluster: Option<u32>,
    },
    /// `cores`: the slice's core count.
    Cores {
        /// Any operator.
        op: SelectorOp,
        /// The count compared with.
        cores: u32,
    },
}

/// Picks slices: `*` (all) or comma-separated terms that must all hold, e.g.
/// `backend=emulator,cores>=8,board=board0`. Keys: `backend`, `board`,
/// `id` (the slice id, `board0/c1`), `cluster` (a number or `whole`),
/// `cores`. Operators: `=`, `!=`, and for `cluster`/`cores` also `>=`, `<=`,
/// `>`, `<`. `board`/`id` values may use `*` wildcards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SliceSelector {
    terms: Vec<SelectorTerm>,
}

fn wildcard_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(part) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(pos) = rest.find(part) {
            rest = &rest[pos + part.len()..];
        } else {
            return false;
        }
    }
    true
}

impl SliceSelector {
    /// The selector that matches every slice.
    pub fn all() -> Self {
        Self { terms: Vec::new() }
    }

    /// The terms that must all hold (none for `*`).
    pub fn terms(&self) -> &[SelectorTerm] {
        &self.terms
    }

    /// Parse selector text (`*`, or terms like `backend=emulator,cores>=8`);
    /// the error names the term at fault.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let fail = |reason: String| SelectorError {
            input: input.to_owned(),
            reason,
        };
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Err(fail("empty selector (use `*` for every slice)".into()));
        }
        if trimmed == "*" {
            return Ok(Self::all());
        }
        let mut terms = Vec::new();
        for raw_term in trimmed.split(',') {
            let term = raw_term.trim();
            if term.is_empty() {
                return Err(fail(
                    "empty term (two commas in a row or a trailing comma)".into(),
                ));
            }
            let Some(op_start) = term.find(['=', '!', '<', '>']) else {
                return Err(fail(format!(
                    "term `{term}` has no operator (expected key=value, key!=value, key>=n, ...)"
                )));
            };
            let key = term[..op_start].trim();
            let after = &term[op_start..];
            let (op, value) = [
                ("!=", SelectorOp::Ne),
                (">=", SelectorOp::Ge),
                ("<=", SelectorOp::Le),
                ("=", SelectorOp::Eq),
                (">", SelectorOp::Gt),
                ("<", SelectorOp::Lt),
            ]
            .iter()
            .find_map(|(sym, op)| after.strip_prefix(sym).map(|v| (*op, v.trim())))
            .ok_or_else(|| fail(format!("term `{term}`: unknown operator")))?;
            if value.is_empty() {
                return Err(fail(format!("term `{term}` has no value")));
            }
            if value.contains(['=', '<', '>', '!']) {
                return Err(fail(format!(
                    "term `{term}`: unexpected operator in the value"
                )));
            }
            let equality_only = |what: &str| -> Result<(), SelectorError> {
                if matches!(op, SelectorOp::Eq | SelectorOp::Ne) {
                    Ok(())
                } else {
                    Err(fail(format!(
                        "term `{term}`: `{what}` supports only = and != (got {})",
                        op.symbol()
                    )))
                }
            };
            let number = |what: &str| -> Result<u32, SelectorError> {
                value.parse::<u32>().map_err(|_| {
                    fail(format!(
                        "term `{term}`: `{what}` needs a non-negative integer, got `{value}`"
                    ))
                })
            };
            let parsed = match key {
                "backend" => {
                    equality_only("backend")?;
                    let backend =
                        parse_backend(value).map_err(|e| fail(format!("term `{term}`: {e}")))?;
                    SelectorTerm::Backend { op, backend }
                }
                "board" => {
                    equality_only("board")?;
                    SelectorTerm::Board {
                        op,
                        pattern: value.to_owned(),
                    }
                }
                "id" | "slice" => {
                    equality_only("id")?;
                    SelectorTerm::Id {
                        op,
                        pattern: value.to_owned(),
                    }
                }
                "cluster" => {
                    if value == "whole" {
                        equality_only("cluster=whole")?;
                        SelectorTerm::Cluster { op, cluster: None }
                    } else {
                        SelectorTerm::Cluster {
                            op,
                            cluster: Some(number("cluster")?),
                        }
                    }
                }
                "cores" => SelectorTerm::Cores {
                    op,
                    cores: number("cores")?,
                },
                "" => return Err(fail(format!("term `{term}` has no key"))),
                other => {
                    return Err(fail(format!(
                        "unknown key `{other}` (expected backend, board, id, cluster or cores)"
                    )));
                }
            };
            terms.push(parsed);
        }
        Ok(Self { terms })
    }

    /// True when every term holds for `slice`.
    pub fn matches(&self, slice: &Slice) -> bool {
        self.terms.iter().all(|term| match term {
            SelectorTerm::Backend { op, backend } => {
                (slice.backend == *backend) == (*op == SelectorOp::Eq)
            }
            SelectorTerm::Board { op, pattern } => {
                wildcard_match(pattern, &slice.board) == (*op == SelectorOp::Eq)
            }
            SelectorTerm::Id { op, pattern } => {
                wildcard_match(pattern, &slice.id()) == (*op == SelectorOp::Eq)
            }
            SelectorTerm::Cluster { op, cluster: None } => {
                slice.cluster.is_none() == (*op == SelectorOp::Eq)
            }
            SelectorTerm::Cluster {
                op,
                cluster: Some(want),
            } => match slice.cluster {
                Some(have) => op.compare(have, *want),
                // A whole board is "not cluster n", and has no order.
                None => *op == SelectorOp::Ne,
            },
            SelectorTerm::Cores { op, cores } => op.compare(slice.cores, *cores),
        })
    }
}

impl fmt::Display for SliceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("*");
        }
        let parts: Vec<String> = self
            .terms
            .iter()
            .map(|t| match t {
                SelectorTerm::Backend { op, backend } => format!("backend{}{backend}", op.symbol()),
                SelectorTerm::Board { op, pattern } => format!("board{}{pattern}", op.symbol()),
                SelectorTerm::Id { op, pattern } => format!("id{}{pattern}", op.symbol()),
                SelectorTerm::Cluster { op, cluster: None } => {
                    format!("cluster{}whole", op.symbol())
                }
                SelectorTerm::Cluster {
                    op,
                    cluster: Some(c),
                } => format!("cluster{}{c}", op.symbol()),
                SelectorTerm::Cores { op, cores } => format!("cores{}{cores}", op.symbol()),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl FromStr for SliceSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for SliceSelector {
    type Error = SelectorError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<SliceSelector> for String {
    fn from(s: SliceSelector) -> Self {
        s.to_string()
    }
}
