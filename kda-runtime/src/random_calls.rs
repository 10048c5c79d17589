//! Random call arguments for the planning property tests of decode and prefill, drawn and
//! shrunk by proptest.
//!
//! A call is built by a sequence of draws whose ranges depend on earlier draws (a shape, then
//! tensors of that shape), so the strategy is a sequence of raw choices, each scaled into the
//! range its draw asks for ([`Draw::r`]): proptest shrinks the raw values toward 0, and a
//! smaller raw value is never a larger draw, so a failing call shrinks to a small one.

use crate::tensor::TensorView;
use kda_dsl::DType;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Every dtype a tensor descriptor may carry.
pub(crate) const DTYPES: [DType; 5] = [DType::BF16, DType::F16, DType::F32, DType::I32, DType::I64];

/// Raw choices per call, more than any call draws (a draw past them is 0).
const MAX_DRAWS: usize = 160;

/// Draws of one random call: counts, dtypes and tensor descriptors, from a sequence of raw
/// choices.
pub(crate) struct Draw {
    raw: Vec<u32>,
    at: usize,
    next: u64,
}

impl Draw {
    /// A call drawn from `raw` (missing choices are 0).
    fn new(raw: Vec<u32>) -> Draw {
        Draw { raw, at: 0, next: 0 }
    }
    /// A number in `0..n` (`n > 0`): the next raw choice scaled into the range, so it grows
    /// with the raw value.
    pub(crate) fn r(&mut self, n: usize) -> usize {
        let raw = self.raw.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        ((raw as u64 * n as u64) >> 32) as usize
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

/// Runs `property` on `cases` random calls drawn from `seed` (deterministically). A failing
/// call (an error or a panic) is shrunk by proptest, and the test panics with the smallest
/// failure found and its raw choices.
pub(crate) fn check_random_calls(seed: u64, cases: u32, property: impl FnMut(&mut Draw) -> Result<(), String>) {
    let property = std::cell::RefCell::new(property);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let strategy = proptest::collection::vec(proptest::num::u32::ANY, MAX_DRAWS);
    let result = TestRunner::new_with_rng(config, rng)
        .run(&strategy, |raw| (property.borrow_mut())(&mut Draw::new(raw)).map_err(TestCaseError::fail));
    if let Err(e) = result {
        panic!("a random call failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A property that fails when two draws sum to 50 or more is reported with a shrunk
    /// failure whose draws sum to exactly 50 (lowering either would pass); a passing one runs
    /// every case.
    #[test]
    fn a_failing_call_shrinks_to_a_smallest_failure() {
        let smallest = std::cell::Cell::new((usize::MAX, 0));
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_random_calls(7, 100, |x| {
                let (a, b) = (x.r(100), x.r(100));
                if a + b >= 50 {
                    smallest.set((a + b, smallest.get().1 + 1));
                    Err(format!("{a} + {b}"))
                } else {
                    Ok(())
                }
            })
        }));
        let message = caught.expect_err("fails").downcast::<String>().expect("a message");
        assert!(message.contains("a random call failed"), "{message}");
        assert_eq!(smallest.get().0, 50, "the last failure proptest tried is the smallest: {message}");
        let mut runs = 0;
        check_random_calls(7, 100, |x| {
            runs += 1;
            (x.r(10) < 10).then_some(()).ok_or_else(|| "out of range".to_string())
        });
        assert_eq!(runs, 100);
    }

    /// A panic inside the property is a failure too.
    #[test]
    fn a_panicking_call_is_a_failure() {
        let caught = std::panic::catch_unwind(|| {
            check_random_calls(3, 50, |x| {
                assert!(x.r(20) < 15, "too large");
                Ok(())
            })
        });
        let message = caught.expect_err("fails").downcast::<String>().expect("a message");
        assert!(message.contains("too large"), "{message}");
    }
}
