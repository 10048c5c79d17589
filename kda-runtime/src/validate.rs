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

/// Every given tensor with elements must be [`POINTER_ALIGN`]-byte aligned; an empty tensor is
/// never accessed, so its address (often 0) does not matter. Reports the first offender.
pub(crate) fn check_aligned<E: ArgError>(tensors: &[(&'static str, Option<&TensorView>)]) -> Result<(), E> {
    for &(name, x) in tensors {
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
