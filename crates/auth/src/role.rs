//! The roles an identity may hold. They are coarse on purpose: each maps to
//! one kind of person or process, and each RPC names the one it needs.

use std::fmt;
use std::str::FromStr;

use crate::error::AuthError;

/// What an identity may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Submit jobs; read, watch, list and cancel its own jobs and their
    /// approvals.
    Submit,
    /// Read every job, its events and its approvals (arguments included);
    /// change nothing.
    Read,
    /// Decide approvals.
    Approve,
    /// Fleet, quarantine, cancel any job.
    Admin,
    /// The leader process: the only caller of a worker daemon's `Worker`
    /// service.
    Leader,
}

impl Role {
    /// Every role, in a stable order.
    pub const ALL: [Role; 5] = [
        Role::Submit,
        Role::Read,
        Role::Approve,
        Role::Admin,
        Role::Leader,
    ];

    /// The name used in identities files and error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Submit => "submit",
            Role::Read => "read",
            Role::Approve => "approve",
            Role::Admin => "admin",
            Role::Leader => "leader",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = AuthError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == s.trim())
            .ok_or_else(|| AuthError::UnknownRole(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().expect("known"), role);
        }
        assert!("root".parse::<Role>().is_err());
    }
}
