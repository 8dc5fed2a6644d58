//! The price table of model tokens (`--prices FILE`): what a million prompt
//! and completion tokens of each model cost, so a job's outcome can say
//! what its agents' tokens cost. Prices change and differ per contract,
//! hence a file the operator keeps rather than numbers in the code:
//!
//! ```toml
//! currency = "USD"                      # the default
//! [prices."gpt-4o-mini"]
//! prompt_per_million = 0.15
//! completion_per_million = 0.60
//! ```
//!
//! A model missing from the table has no price: its tokens are reported,
//! their cost is not invented.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Errors reading a price table.
#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    /// The file could not be read.
    #[error("cannot read the price table {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a price table.
    #[error("invalid price table {path}: {}", parse_message(.source))]
    Parse {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: toml::de::Error,
    },
    /// A price is negative, not a number, or above [`MAX_PRICE_PER_MILLION`].
    #[error(
        "invalid price table {path}: model {model:?}: {field} must be a number from 0 to {MAX_PRICE_PER_MILLION:e}, not {value:?}"
    )]
    Price {
        /// The file.
        path: PathBuf,
        /// The model whose price is wrong.
        model: String,
        /// `prompt_per_million` or `completion_per_million`.
        field: &'static str,
        /// The value given.
        value: f64,
    },
}

/// Highest price of a million tokens a table may give: far above any
/// real one, and low enough that every job's cost stays a finite number
/// (even at `u64::MAX` tokens).
pub const MAX_PRICE_PER_MILLION: f64 = 1e6;

/// Longest model name an error quotes whole.
const MAX_MODEL_NAME_SHOWN: usize = 256;

/// What a million tokens of one model cost.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Price of a million prompt (input) tokens.
    pub prompt_per_million: f64,
    /// Price of a million completion (output) tokens.
    pub completion_per_million: f64,
}

/// Prices per model name, in one currency.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTable {
    /// The currency of every price (default "USD").
    #[serde(default = "default_currency")]
    pub currency: String,
    /// Model name (as the endpoint knows it) -> its price.
    #[serde(default)]
    pub prices: BTreeMap<String, ModelPrice>,
}

fn default_currency() -> String {
    "USD".to_string()
}

impl Default for PriceTable {
    fn default() -> Self {
        Self {
            currency: default_currency(),
            prices: BTreeMap::new(),
        }
    }
}

/// The parser's complaint and where it is, without the file's line the
/// parser would quote whole (a huge line would make a huge error).
fn parse_message(error: &toml::de::Error) -> String {
    let message: String = error.message().chars().take(300).collect();
    match error.span() {
        Some(span) => format!("{message} (bytes {}..{})", span.start, span.end),
        None => message,
    }
}

impl PriceTable {
    /// Reads and checks the table in `path`.
    pub fn load(path: &Path) -> Result<Self, PriceError> {
        let text = std::fs::read_to_string(path).map_err(|source| PriceError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks `text` (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, PriceError> {
        let table: PriceTable = toml::from_str(text).map_err(|source| PriceError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        for (model, price) in &table.prices {
            for (field, value) in [
                ("prompt_per_million", price.prompt_per_million),
                ("completion_per_million", price.completion_per_million),
            ] {
                if !(0.0..=MAX_PRICE_PER_MILLION).contains(&value) {
                    return Err(PriceError::Price {
                        path: path.to_path_buf(),
                        // The name is the file's: a huge one is cut.
                        model: mtswarm_core::truncate_for_model(model, MAX_MODEL_NAME_SHOWN)
                            .into_owned(),
                        field,
                        value,
                    });
                }
            }
        }
        Ok(table)
    }

    /// The price of `model`, if the table has one.
    pub fn price(&self, model: &str) -> Option<ModelPrice> {
        self.prices.get(model.trim()).copied()
    }

    /// What `prompt` and `completion` tokens of `model` cost; `None`
    /// without a price.
    pub fn cost(&self, model: &str, prompt: u64, completion: u64) -> Option<f64> {
        self.price(model).map(|price| {
            (prompt as f64 * price.prompt_per_million
                + completion as f64 * price.completion_per_million)
                / 1_000_000.0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_prices_its_models_and_only_those() {
        let table = PriceTable::parse(
            "[prices.\"gpt-4o-mini\"]\nprompt_per_million = 0.15\ncompletion_per_million = 0.6\n",
            Path::new("prices.toml"),
        )
        .expect("a valid table");
        assert_eq!(table.currency, "USD");
        let cost = table
            .cost("gpt-4o-mini", 2_000_000, 500_000)
            .expect("priced");
        assert!((cost - (0.30 + 0.30)).abs() < 1e-12, "{cost}");
        assert_eq!(table.cost("other-model", 10, 10), None);
    }

    #[test]
    fn bad_tables_are_refused_with_what_is_wrong() {
        for (text, wanted) in [
            (
                "[prices.m]\nprompt_per_million = -1.0\ncompletion_per_million = 1.0\n",
                "prompt_per_million must be a number from 0 to 1e6",
            ),
            (
                "[prices.m]\nprompt_per_million = 1.0\ncompletion_per_million = 0.1e308\n",
                "completion_per_million must be a number from 0 to 1e6, not 1e307",
            ),
            (
                "[prices.m]\nprompt_per_million = 1.0\ncompletion_per_million = nan\n",
                "completion_per_million must be",
            ),
            (
                "[prices.m]\nprompt_per_million = 1.0\n",
                "completion_per_million",
            ),
            (
                "[prices.m]\nprompt = 1.0\ncompletion_per_million = 1.0\n",
                "unknown field",
            ),
            ("prices = 3\n", "invalid price table"),
        ] {
            let error = PriceTable::parse(text, Path::new("p.toml"))
                .expect_err(text)
                .to_string();
            assert!(error.contains(wanted), "{text}: {error}");
        }
    }

    #[test]
    fn a_huge_model_name_is_not_quoted_whole() {
        let name = "m".repeat(100_000);
        let text = format!(
            "[prices.\"{name}\"]\nprompt_per_million = -1.0\ncompletion_per_million = 1.0\n"
        );
        let error = PriceTable::parse(&text, Path::new("p.toml"))
            .expect_err("a negative price")
            .to_string();
        assert!(error.len() < 1024, "{} bytes", error.len());
        assert!(error.contains("prompt_per_million") && error.contains("original length 100000"));
    }

    #[test]
    fn a_huge_line_is_not_quoted_whole() {
        let text = format!(
            "[prices.m]\nprompt_per_million = 0.{}\n",
            "n = 0.".repeat(3_000)
        );
        let error = PriceTable::parse(&text, Path::new("p.toml"))
            .expect_err("bad")
            .to_string();
        assert!(error.len() < 500, "{} bytes", error.len());
        assert!(error.contains("(bytes "), "{error}");
    }
}
