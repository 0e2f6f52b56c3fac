//! The snapshot-id grammar of the `berth:snapshot` contract (clause 1),
//! `[A-Za-z0-9._-]{1,128}` and not `.` or `..`: the one implementation,
//! used by the host (`berth::SnapshotId`) and by guests (through
//! `berth-guest-kit`). Ids name files and object keys, so they are limited
//! to a set that can never be read as a path. No dependencies: it builds
//! for any target.
#![no_std]
#![deny(missing_docs)]

/// Longest id the contract allows, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// Why a string breaks the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdGrammarError {
    /// Empty or longer than [`MAX_ID_LEN`] bytes (the length given).
    Length(usize),
    /// `.` or `..`.
    Reserved,
    /// A character outside `A-Z a-z 0-9 . _ -` (the first one).
    Character(char),
}

impl core::fmt::Display for IdGrammarError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            IdGrammarError::Length(n) => {
                write!(f, "it must be 1 to {MAX_ID_LEN} characters long, not {n}")
            }
            IdGrammarError::Reserved => f.write_str("`.` and `..` are reserved"),
            IdGrammarError::Character(c) => {
                write!(f, "{c:?} is not allowed; allowed are A-Z a-z 0-9 . _ -")
            }
        }
    }
}

impl core::error::Error for IdGrammarError {}

/// Checks `id` against the grammar.
pub fn check(id: &str) -> Result<(), IdGrammarError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(IdGrammarError::Length(id.len()));
    }
    if id == "." || id == ".." {
        return Err(IdGrammarError::Reserved);
    }
    match id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(bad) => Err(IdGrammarError::Character(bad)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar() {
        assert_eq!(check("a.b_c-D9"), Ok(()));
        assert_eq!(check(&"x".repeat(128)), Ok(()));
        assert_eq!(check(""), Err(IdGrammarError::Length(0)));
        assert_eq!(check(&"x".repeat(129)), Err(IdGrammarError::Length(129)));
        assert_eq!(check(".."), Err(IdGrammarError::Reserved));
        assert_eq!(check("a/b"), Err(IdGrammarError::Character('/')));
        assert_eq!(check("é"), Err(IdGrammarError::Character('é')));
    }
}
