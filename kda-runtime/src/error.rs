//! The runtime's error type.

use std::fmt;

use cudarc::driver::DriverError;

/// Everything that can go wrong when allocating, loading, launching or timing on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeError {
    /// No usable CUDA GPU: the driver library could not be loaded or reports no device.
    NoGpu,
    /// A CUDA driver call failed.
    Driver {
        /// The driver operation that failed (`cuLaunchKernel`, `cuModuleLoadDataEx`, ...).
        op: &'static str,
        /// The driver's error name and description, plus any JIT log.
        message: String,
    },
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
        RuntimeError::Driver { op, message }
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
            RuntimeError::Driver { op, message } => write!(f, "CUDA call {op} failed: {message}"),
            RuntimeError::BadArgument { name, expected, got } => {
                write!(f, "bad argument `{name}`: expected {expected}, got {got}")
            }
            RuntimeError::Unsupported(what) => write!(f, "unsupported: {what}"),
        }
    }
}

impl std::error::Error for RuntimeError {}

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
