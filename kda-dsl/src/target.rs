//! Targets and the PTX ISA version each needs.

use std::fmt;

/// A PTX target architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Target {
    /// Ampere (`sm_80`), the default; runs on Hopper through the driver's JIT.
    #[default]
    Sm80,
    /// Hopper (`sm_90`), the instructions every sm_90 part has.
    Sm90,
    /// Hopper with its architecture-specific instructions (`sm_90a`: `wgmma`, `setmaxnreg`),
    /// which run on compute capability 9.0 exactly (not on later architectures).
    Sm90a,
}

impl Target {
    /// `.target` name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90 => "sm_90",
            Target::Sm90a => "sm_90a",
        }
    }

    /// The lowest `.version` the target allows; every instruction the lowering emits
    /// (`cp.async`, `ldmatrix`, bf16 `mma`, `cvt.rn.bf16x2.f32`) exists at it.
    pub fn ptx_version(self) -> (u32, u32) {
        match self {
            Target::Sm80 => (7, 0),
            Target::Sm90 => (7, 8),
            Target::Sm90a => (8, 0),
        }
    }

    /// Parses `sm_80`, `sm_90` or `sm_90a`.
    pub fn parse(s: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Whether code for this target may use the instructions of `other`: `sm_90a` has all of
    /// `sm_90`'s, and `sm_90` all of `sm_80`'s.
    pub fn has(self, other: Target) -> bool {
        match self {
            Target::Sm80 => other == Target::Sm80,
            Target::Sm90 => other != Target::Sm90a,
            Target::Sm90a => true,
        }
    }

    /// Every target.
    pub const ALL: [Target; 3] = [Target::Sm80, Target::Sm90, Target::Sm90a];
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sm_90a code may use every target's instructions, sm_90 code sm_80's and its own, sm_80
    /// code only its own.
    #[test]
    fn each_target_has_the_instructions_of_those_below_it() {
        let has: Vec<(Target, Target)> =
            Target::ALL.into_iter().flat_map(|a| Target::ALL.map(|b| (a, b))).filter(|(a, b)| a.has(*b)).collect();
        use Target::*;
        assert_eq!(has, [(Sm80, Sm80), (Sm90, Sm80), (Sm90, Sm90), (Sm90a, Sm80), (Sm90a, Sm90), (Sm90a, Sm90a)]);
    }
}
