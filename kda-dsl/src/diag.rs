//! Source locations and diagnostics carried from the kernel source through every level.

use std::fmt;

/// A position in the kernel author's Rust source (the `#[kernel]` body).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SrcLoc {
    /// The source file, as `file!()` prints it.
    pub file: &'static str,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl SrcLoc {
    /// A location; the macro builds these from `file!()`, `line!()`, `column!()` at the user's token.
    pub const fn new(file: &'static str, line: u32, col: u32) -> SrcLoc {
        SrcLoc { file, line, col }
    }
}

impl fmt::Display for SrcLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// An error found while building, checking or lowering a kernel, at the kernel line it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diag {
    /// Where in the kernel source.
    pub loc: SrcLoc,
    /// What is wrong and what was expected.
    pub message: String,
}

impl Diag {
    /// A diagnostic at `loc`.
    pub fn new(loc: SrcLoc, message: impl Into<String>) -> Diag {
        Diag { loc, message: message.into() }
    }
}

impl fmt::Display for Diag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.loc, self.message)
    }
}

impl std::error::Error for Diag {}

/// Returns `Err(Diag)` at `loc` with a formatted message.
#[macro_export]
macro_rules! bail {
    ($loc:expr, $($arg:tt)*) => {
        return Err($crate::diag::Diag::new($loc, format!($($arg)*)))
    };
}
