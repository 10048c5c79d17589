//! Random call arguments for the planning property tests of decode and prefill.

use crate::tensor::TensorView;
use kda_dsl::DType;

/// Every dtype a tensor descriptor may carry.
pub(crate) const DTYPES: [DType; 5] = [DType::BF16, DType::F16, DType::F32, DType::I32, DType::I64];

/// Draws of one random call: counts, dtypes and tensor descriptors. Every draw is a choice
/// `r(n)` in `0..n`, recorded, so a failing call can be replayed with smaller choices
/// ([`check_random_calls`] shrinks it).
pub(crate) struct Draw {
    source: Source,
    next: u64,
    choices: Vec<usize>,
}

/// Where a [`Draw`]'s choices come from.
enum Source {
    Random(kda_kernels::reference::Rng),
    /// Recorded choices (each clamped to its range), then zeros.
    Replay {
        choices: Vec<usize>,
        at: usize,
    },
}

impl Draw {
    /// A generator from `seed`.
    pub(crate) fn new(seed: u64) -> Draw {
        Draw { source: Source::Random(kda_kernels::reference::Rng::new(seed)), next: 0, choices: vec![] }
    }
    /// A generator that makes the choices `choices`, then zeros.
    fn replay(choices: Vec<usize>) -> Draw {
        Draw { source: Source::Replay { choices, at: 0 }, next: 0, choices: vec![] }
    }
    /// A number in `0..n` (`n > 0`).
    pub(crate) fn r(&mut self, n: usize) -> usize {
        let v = match &mut self.source {
            Source::Random(rng) => (rng.next_u64() % n as u64) as usize,
            Source::Replay { choices, at } => {
                let v = choices.get(*at).copied().unwrap_or(0).min(n - 1);
                *at += 1;
                v
            }
        };
        self.choices.push(v);
        v
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

/// Runs `property` on `cases` random calls drawn from `seed`. A call that fails (an error or a
/// panic) is shrunk: its choices are made smaller one at a time, keeping each change under
/// which it still fails, and the test panics with the first failure and the smallest one
/// found. Without a dependency, this is the choice-sequence shrinking property-test libraries
/// use.
pub(crate) fn check_random_calls(seed: u64, cases: u64, mut property: impl FnMut(&mut Draw) -> Result<(), String>) {
    let mut seeds = kda_kernels::reference::Rng::new(seed);
    for case in 0..cases {
        let mut x = Draw::new(seeds.next_u64());
        if let Err(first) = run_case(&mut property, &mut x) {
            let (choices, smallest) = shrink(&mut property, x.choices, first.clone());
            panic!("random call {case} failed: {first}\nshrunk to the choices {choices:?}: {smallest}");
        }
    }
}

/// `property` on `x`, a panic turned into an error.
fn run_case(property: &mut impl FnMut(&mut Draw) -> Result<(), String>, x: &mut Draw) -> Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| property(x))).unwrap_or_else(|panic| {
        let text =
            panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(format!("panicked: {}", text.unwrap_or_default()))
    })
}

/// The smallest failing choices found from `choices` (each lowered to 0, to half or by one
/// while the call still fails; the sum of the choices falls with every step, so it ends).
fn shrink(
    property: &mut impl FnMut(&mut Draw) -> Result<(), String>,
    mut choices: Vec<usize>,
    mut message: String,
) -> (Vec<usize>, String) {
    let mut i = 0;
    while i < choices.len() {
        let v = choices[i];
        let smaller = [0, v / 2, v.saturating_sub(1)].into_iter().filter(|&c| c < v);
        let mut shrunk = false;
        for c in smaller {
            let mut tried = choices.clone();
            tried[i] = c;
            let mut x = Draw::replay(tried);
            if let Err(m) = run_case(property, &mut x) {
                (choices, message, shrunk) = (x.choices, m, true);
                break;
            }
        }
        // After a change the earlier choices may shrink further: start over.
        i = if shrunk { 0 } else { i + 1 };
    }
    (choices, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A property that fails when two draws sum to 50 or more shrinks to a failing pair that
    /// sums to exactly 50; a passing one runs every case.
    #[test]
    fn a_failing_call_shrinks_to_a_smallest_failure() {
        let caught = std::panic::catch_unwind(|| {
            check_random_calls(7, 100, |x| {
                let (a, b) = (x.r(100), x.r(100));
                if a + b >= 50 {
                    Err(format!("{a} + {b}"))
                } else {
                    Ok(())
                }
            })
        });
        let message = caught.expect_err("fails").downcast::<String>().expect("a message");
        let shrunk = message.split("shrunk to the choices ").nth(1).expect("shrunk");
        let (list, said) = shrunk.split_once(": ").expect("choices, then the failure");
        let values: Vec<usize> =
            list.trim_matches(['[', ']']).split(", ").map(|v| v.parse().expect("a number")).collect();
        assert_eq!(values.iter().sum::<usize>(), 50, "{message}");
        assert_eq!(said, format!("{} + {}", values[0], values[1]));
        let mut runs = 0;
        check_random_calls(7, 100, |x| {
            runs += 1;
            (x.r(10) < 10).then_some(()).ok_or_else(|| "out of range".to_string())
        });
        assert_eq!(runs, 100);
    }

    /// A panic inside the property is a failure too, and shrinks.
    #[test]
    fn a_panicking_call_is_a_failure() {
        let caught = std::panic::catch_unwind(|| {
            check_random_calls(3, 50, |x| {
                assert!(x.r(20) < 15, "too large");
                Ok(())
            })
        });
        let message = caught.expect_err("fails").downcast::<String>().expect("a message");
        assert!(message.contains("panicked: too large") && message.contains("choices [15]"), "{message}");
    }
}
