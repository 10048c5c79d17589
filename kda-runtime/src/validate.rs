//! Checks shared by the validated entry points (`decode`, `chunk`).
//!
//! Each entry point has its own error type (so its errors name its own argument struct); the
//! helpers here are generic over [`ArgError`], which both implement, so a check is written once
//! and words its message the same way everywhere.

use crate::launch::POINTER_ALIGN;
use crate::tensor::TensorView;

/// The only head dimension (K and V) the kernels support.
pub(crate) const HEAD_DIM: usize = 128;

/// An entry point's error type, built from the argument's name and a message.
pub(crate) trait ArgError: Sized {
    /// The arguments break the API's contract.
    fn invalid(arg: &'static str, message: String) -> Self;
    /// Well-formed, but not supported by the kernels.
    fn unsupported(arg: &'static str, message: String) -> Self;
}

/// Defines an entry point's error type: `InvalidArgument` (the reference's `ValueError`) and
/// `Unsupported` (its `NotImplementedError`/`TypeError`, and the kernels' limits), each naming
/// the offending field of the entry point's argument struct, with `arg()`, `message()`,
/// `Display` (`arg: message`), [`ArgError`] and the conversion into [`crate::RuntimeError`]'s
/// variant for the entry point.
macro_rules! arg_error_type {
    ($(#[$doc:meta])* $name:ident, $args:literal, $variant:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum $name {
            /// The arguments break the API's contract (the reference's `ValueError`).
            InvalidArgument {
                #[doc = concat!("The offending [`", $args, "`] field.")]
                arg: &'static str,
                /// What is wrong, in the reference's words where it has them.
                message: String,
            },
            /// Well-formed, but not supported here (the reference's `NotImplementedError` or
            /// `TypeError`, and the kernels' limits: head dim, dtypes, ranges, alignment).
            Unsupported {
                #[doc = concat!("The offending [`", $args, "`] field.")]
                arg: &'static str,
                /// What is not supported.
                message: String,
            },
        }

        impl $name {
            #[doc = concat!("The offending [`", $args, "`] field.")]
            pub fn arg(&self) -> &'static str {
                match self {
                    $name::InvalidArgument { arg, .. } | $name::Unsupported { arg, .. } => arg,
                }
            }

            /// The message, without the argument name.
            pub fn message(&self) -> &str {
                match self {
                    $name::InvalidArgument { message, .. } | $name::Unsupported { message, .. } => message,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}: {}", self.arg(), self.message())
            }
        }

        impl std::error::Error for $name {}

        impl $crate::validate::ArgError for $name {
            fn invalid(arg: &'static str, message: String) -> Self {
                $name::InvalidArgument { arg, message }
            }

            fn unsupported(arg: &'static str, message: String) -> Self {
                $name::Unsupported { arg, message }
            }
        }

        impl From<$name> for $crate::error::RuntimeError {
            fn from(err: $name) -> Self {
                $crate::error::RuntimeError::$variant(err)
            }
        }
    };
}
pub(crate) use arg_error_type;

/// A shape as the messages print it: `[2, 1, 4, 128]`.
pub(crate) fn shape(x: &TensorView) -> String {
    format!("{:?}", x.shape())
}

/// `x` must live on `q`'s device (the kernels are launched there and cannot reach another
/// device's memory).
pub(crate) fn same_device<E: ArgError>(q: &TensorView, name: &'static str, x: &TensorView) -> Result<(), E> {
    if x.device() == q.device() {
        return Ok(());
    }
    Err(E::invalid(name, format!("Expected {name} to be on device cuda:{}, got cuda:{}.", q.device(), x.device())))
}

/// Every given tensor with elements must have a non-null, [`POINTER_ALIGN`]-byte aligned address;
/// an empty tensor is never accessed, so its address (often 0) does not matter. Reports the
/// first offender.
pub(crate) fn check_aligned<E: ArgError>(tensors: &[(&'static str, Option<&TensorView>)]) -> Result<(), E> {
    for &(name, x) in tensors {
        if x.is_some_and(|x| x.numel() > 0 && x.ptr() == 0) {
            return Err(E::invalid(name, format!("{name} has elements but a null address.")));
        }
        if let Some(x) = x.filter(|x| x.numel() > 0 && x.ptr() % POINTER_ALIGN != 0) {
            let msg = format!(
                "{name} must be {POINTER_ALIGN}-byte aligned (the kernels use vector loads), got address {:#x}.",
                x.ptr()
            );
            return Err(E::unsupported(name, msg));
        }
    }
    Ok(())
}
