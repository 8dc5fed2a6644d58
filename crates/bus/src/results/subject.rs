//! Subject of a stored record: `mtswarm.measurement.<job_id>.<kernel>.<hash16>.<slice>`,
//! with every free-form value made a safe token.

use crate::error::BusError;

use crate::subjects;

/// Characters of the kernel hash used as a subject token.
pub(super) const HASH_TOKEN_LEN: usize = 16;
/// Longest kernel or slice subject token.
const MAX_TOKEN_LEN: usize = 64;

/// A kernel name or slice id as a subject token: characters outside
/// `[A-Za-z0-9_-]` become `_` (so `board0/c1` is `board0_c1`), at most 64
/// characters, `none` when empty. Distinct names may share a token; queries
/// compare the exact values after the server's filter.
pub fn token(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .take(MAX_TOKEN_LEN)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "none".to_string()
    } else {
        cleaned
    }
}

pub(super) fn hash_token(hash: &str) -> String {
    token(&hash.chars().take(HASH_TOKEN_LEN).collect::<String>())
}

/// `mtswarm.measurement.<job_id>.<kernel>.<hash16>.<slice>` (kernel, hash
/// prefix and slice as [`token`]s).
pub fn measurement_subject(
    job_id: &str,
    kernel: &str,
    kernel_hash: &str,
    slice_id: &str,
) -> Result<String, BusError> {
    subjects::validate_id("job id", job_id)?;
    Ok(format!(
        "{}.measurement.{job_id}.{}.{}.{}",
        subjects::PREFIX,
        token(kernel),
        hash_token(kernel_hash),
        // Both spellings of a slice share its token (queries canonicalize).
        token(&canonical_slice_id(slice_id))
    ))
}

/// The one spelling of a slice id in records and outputs: the bus form,
/// every character outside `[A-Za-z0-9_-]` replaced by `-` (`board0/c1` ->
/// `board0-c1`). Inputs in either spelling go through this.
pub fn canonical_slice_id(slice: &str) -> String {
    slice
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}
