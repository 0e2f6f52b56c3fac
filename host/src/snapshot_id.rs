//! The snapshot-id grammar from the WIT contract (clause 1): ids name files
//! and object keys, so they are restricted to a set that can never be read as
//! a path.

use std::fmt;

/// Longest id the contract allows.
pub const MAX_ID_LEN: usize = berth_id::MAX_ID_LEN;

/// A validated snapshot id: `[A-Za-z0-9._-]{1,128}`, not `.` or `..`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct SnapshotId(String);

/// Why a string is not a snapshot id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotIdError {
    /// Empty or longer than [`MAX_ID_LEN`].
    #[error("snapshot id must be 1 to {MAX_ID_LEN} characters long, got {0}")]
    Length(usize),
    /// `.` or `..`.
    #[error("snapshot id {0:?} is reserved")]
    Reserved(String),
    /// A character outside the grammar.
    #[error("snapshot id {id:?} contains {bad:?}; allowed are A-Z a-z 0-9 . _ -")]
    Character {
        /// The rejected id.
        id: String,
        /// The first character outside the grammar.
        bad: char,
    },
}

impl SnapshotId {
    /// Validates `id` against the grammar.
    pub fn parse(id: &str) -> Result<Self, SnapshotIdError> {
        match berth_id::check(id) {
            Ok(()) => Ok(SnapshotId(id.to_string())),
            Err(berth_id::IdGrammarError::Length(n)) => Err(SnapshotIdError::Length(n)),
            Err(berth_id::IdGrammarError::Reserved) => {
                Err(SnapshotIdError::Reserved(id.to_string()))
            }
            Err(berth_id::IdGrammarError::Character(bad)) => Err(SnapshotIdError::Character {
                id: id.to_string(),
                bad,
            }),
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for SnapshotId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SnapshotId::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        for ok in ["a", "A-b_c.d", "0", &"x".repeat(128), "..a", ".hidden"] {
            assert!(SnapshotId::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a b",
            "é",
            &"x".repeat(129),
            "a\0",
        ] {
            assert!(SnapshotId::parse(bad).is_err(), "{bad:?}");
        }
    }
}
