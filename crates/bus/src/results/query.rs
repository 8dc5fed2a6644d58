//! Which records a query selects, and the subject tokens that let the
//! server filter on job, kernel, kernel hash and slice.

use std::time::SystemTime;

use super::record::{CandidateStatus, ResultRecord, unix_millis};
use super::subject::{HASH_TOKEN_LEN, canonical_slice_id, hash_token, token};
use super::{DEFAULT_QUERY_LIMIT, MAX_QUERY_LIMIT};
use crate::error::BusError;
use crate::subjects;

/// Filters of [`ResultsStore::query`](crate::ResultsStore::query). Every `Some` narrows the result.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultQuery {
    /// Only this job's records.
    pub job_id: Option<String>,
    /// Kernel name.
    pub kernel: Option<String>,
    /// Full kernel hash, or a prefix of at least 4 characters.
    pub kernel_hash: Option<String>,
    /// Only records measured on this slice (canonicalized before matching).
    pub slice: Option<String>,
    /// Only records of this backend (`emulator`, `sdk` or `host`).
    pub backend: Option<String>,
    /// Only valid measurements.
    pub valid_only: bool,
    /// Only records with one of these statuses (empty = every status).
    pub statuses: Vec<CandidateStatus>,
    /// Only records measured at or after this instant.
    pub since: Option<SystemTime>,
    /// At most this many records: the most recently stored matches, in
    /// stream (storage) order.
    pub limit: usize,
}

impl Default for ResultQuery {
    fn default() -> Self {
        Self {
            job_id: None,
            kernel: None,
            kernel_hash: None,
            slice: None,
            backend: None,
            valid_only: false,
            statuses: Vec::new(),
            since: None,
            limit: DEFAULT_QUERY_LIMIT,
        }
    }
}

impl ResultQuery {
    pub(super) fn check(&self) -> Result<(), BusError> {
        if self.limit == 0 || self.limit > MAX_QUERY_LIMIT {
            return Err(BusError::InvalidId {
                kind: "query limit",
                value: self.limit.to_string(),
                reason: "must be between 1 and 100000",
            });
        }
        if let Some(job_id) = &self.job_id {
            subjects::validate_id("job id", job_id)?;
        }
        if let Some(hash) = &self.kernel_hash
            && hash.len() < 4
        {
            return Err(BusError::InvalidId {
                kind: "kernel hash",
                value: hash.clone(),
                reason: "give at least 4 characters of the hash",
            });
        }
        Ok(())
    }

    /// The narrowest subject filter the server can apply.
    pub(super) fn filter_subject(&self) -> String {
        let job = self.job_id.as_deref().unwrap_or("*");
        let kernel = self.kernel.as_deref().map_or("*".to_string(), token);
        // A hash shorter than the token can only be matched while scanning.
        let hash = match &self.kernel_hash {
            Some(h) if h.len() >= HASH_TOKEN_LEN => hash_token(h),
            _ => "*".to_string(),
        };
        let slice = self
            .slice
            .as_deref()
            .map_or("*".to_string(), |s| token(&canonical_slice_id(s)));
        if job == "*" && kernel == "*" && hash == "*" && slice == "*" {
            return subjects::ALL_MEASUREMENTS.to_string();
        }
        format!(
            "{}.measurement.{job}.{kernel}.{hash}.{slice}",
            subjects::PREFIX
        )
    }

    /// Whether `record` passes every filter (the subject filter already
    /// narrowed by token; this is exact).
    pub fn matches(&self, record: &ResultRecord) -> bool {
        let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        same(&self.job_id, &record.job_id)
            && same(&self.kernel, &record.kernel)
            && self
                .slice
                .as_deref()
                .is_none_or(|s| canonical_slice_id(s) == canonical_slice_id(&record.slice_id))
            && same(&self.backend, &record.backend)
            && self
                .kernel_hash
                .as_deref()
                .is_none_or(|h| record.kernel_hash.starts_with(h))
            && (!self.valid_only || record.valid)
            && (self.statuses.is_empty() || self.statuses.contains(&record.status()))
            && self
                .since
                .is_none_or(|since| record.timestamp_ms >= unix_millis(since))
    }
}
