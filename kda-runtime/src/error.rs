//! The runtime's error type.

use std::fmt;

pub use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;

use crate::chunk::ChunkError;
use crate::decode::DecodeError;

/// Everything that can go wrong when validating, allocating, loading, launching or timing on a
/// GPU. An entry point's rejected call keeps its own typed error ([`RuntimeError::Decode`],
/// [`RuntimeError::Chunk`], also as [`std::error::Error::source`]); a failed driver call keeps
/// the driver's code, so that running out of memory or an illegal address can be matched.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeError {
    /// No usable CUDA GPU: the driver library could not be loaded or reports no device.
    NoGpu,
    /// A CUDA driver call failed.
    Driver {
        /// The driver operation that failed (`cuLaunchKernel`, `cuModuleLoadDataEx`, ...).
        op: &'static str,
        /// The driver's result code (`CUDA_ERROR_OUT_OF_MEMORY`, `CUDA_ERROR_ILLEGAL_ADDRESS`, ...).
        code: CUresult,
        /// The driver's error name and description, plus any JIT log.
        message: String,
    },
    /// `gated_delta_rule_decode` rejected the call (nothing was launched).
    Decode(DecodeError),
    /// `chunk_kda` rejected the call (nothing was launched).
    Chunk(ChunkError),
    /// An argument did not match what the callee expects.
    BadArgument {
        /// The argument's name (a kernel parameter, or a function argument such as `data`).
        name: String,
        /// What was expected.
        expected: String,
        /// What was given.
        got: String,
    },
    /// The request is well-formed but not supported (unknown extents, unstorable dtypes, ...).
    Unsupported(String),
}

impl RuntimeError {
    /// Wraps a driver error from operation `op`, with the driver's name and description.
    pub fn driver(op: &'static str, err: DriverError) -> Self {
        let name = err.error_name().map(|s| s.to_string_lossy().into_owned());
        let text = err.error_string().map(|s| s.to_string_lossy().into_owned());
        let message = match (name, text) {
            (Ok(name), Ok(text)) => format!("{name}: {text}"),
            _ => format!("CUresult {:?}", err.0),
        };
        RuntimeError::Driver { op, code: err.0, message }
    }

    /// The driver's result code, for a failed driver call.
    pub fn driver_code(&self) -> Option<CUresult> {
        match self {
            RuntimeError::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether a driver call ran out of device memory (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn is_out_of_memory(&self) -> bool {
        self.driver_code() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Builds a [`RuntimeError::BadArgument`].
    pub fn bad_argument(name: impl Into<String>, expected: impl Into<String>, got: impl Into<String>) -> Self {
        RuntimeError::BadArgument { name: name.into(), expected: expected.into(), got: got.into() }
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::NoGpu => {
                f.write_str("no CUDA GPU: expected the CUDA driver (libcuda) to load and report a device")
            }
            RuntimeError::Driver { op, message, .. } => write!(f, "CUDA call {op} failed: {message}"),
            RuntimeError::Decode(e) => write!(f, "gated_delta_rule_decode: bad argument {e}"),
            RuntimeError::Chunk(e) => write!(f, "chunk_kda: bad argument {e}"),
            RuntimeError::BadArgument { name, expected, got } => {
                write!(f, "bad argument `{name}`: expected {expected}, got {got}")
            }
            RuntimeError::Unsupported(what) => write!(f, "unsupported: {what}"),
        }
    }
}

impl std::error::Error for RuntimeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::Decode(e) => Some(e),
            RuntimeError::Chunk(e) => Some(e),
            _ => None,
        }
    }
}

/// Attaches the failing operation's name to a driver result.
pub(crate) trait DriverResultExt<T> {
    /// Maps a [`DriverError`] to [`RuntimeError::Driver`] for operation `op`.
    fn op(self, op: &'static str) -> Result<T, RuntimeError>;
}

impl<T> DriverResultExt<T> for Result<T, DriverError> {
    fn op(self, op: &'static str) -> Result<T, RuntimeError> {
        self.map_err(|e| RuntimeError::driver(op, e))
    }
}
