//! The L2 cache policy of a global access: a property of a copy in the tile IR and of a load or
//! store in the thread IR, so it lives apart from both.

/// How long a global access's lines should stay in L2 (`Region::Global::cache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CachePolicy {
    /// The hardware's default.
    #[default]
    Normal,
    /// Evicted first: data the kernel reads or writes once (a streamed state), so it does not
    /// push out what other blocks still read. Loads and stores print as `.cs`; a `cp.async`
    /// carries the L2 policy in [`crate::thread_ir::EVICT_FIRST_POLICY`], which the printer
    /// creates at entry.
    EvictFirst,
}
