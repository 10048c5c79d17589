//! Random call arguments for the planning property tests of decode and prefill.

use crate::tensor::TensorView;
use kda_dsl::DType;

/// Every dtype a tensor descriptor may carry.
pub(crate) const DTYPES: [DType; 5] = [DType::BF16, DType::F16, DType::F32, DType::I32, DType::I64];

/// Draws of one random call: counts, dtypes and tensor descriptors.
pub(crate) struct Draw {
    rng: kda_kernels::reference::Rng,
    next: u64,
}

impl Draw {
    /// A generator from `seed`.
    pub(crate) fn new(seed: u64) -> Draw {
        Draw { rng: kda_kernels::reference::Rng::new(seed), next: 0 }
    }
    /// A number in `0..n`.
    pub(crate) fn r(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }
    /// One of `xs`.
    pub(crate) fn of<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.r(xs.len())]
    }
    /// `d`, or now and then any dtype.
    pub(crate) fn mostly(&mut self, d: DType) -> DType {
        if self.r(15) == 0 {
            self.of(&DTYPES)
        } else {
            d
        }
    }
    /// A descriptor: mostly aligned at a fresh address; sometimes misaligned, null or on
    /// device 1.
    pub(crate) fn view(&mut self, shape: &[usize], dtype: DType) -> TensorView {
        self.next += 1;
        let ptr = match self.r(40) {
            0 => 0x1000 * self.next + 2,
            1 => 0,
            _ => 0x1000 * self.next,
        };
        let device = usize::from(self.r(60) == 0);
        TensorView::describe(ptr, shape, dtype, device).expect("a descriptor")
    }
}
