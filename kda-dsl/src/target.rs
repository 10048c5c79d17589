//! Targets and the PTX ISA version each needs.

use std::fmt;

/// A PTX target architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Target {
    /// Ampere (`sm_80`), the default; runs on Hopper through the driver's JIT.
    #[default]
    Sm80,
    /// Hopper (`sm_90`).
    Sm90,
}

impl Target {
    /// `.target` name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90 => "sm_90",
        }
    }

    /// The lowest `.version` the target allows; every instruction the lowering emits
    /// (`cp.async`, `ldmatrix`, bf16 `mma`, `cvt.rn.bf16x2.f32`) exists at it.
    pub fn ptx_version(self) -> (u32, u32) {
        match self {
            Target::Sm80 => (7, 0),
            Target::Sm90 => (7, 8),
        }
    }

    /// Parses `sm_80` / `sm_90`.
    pub fn parse(s: &str) -> Option<Target> {
        match s {
            "sm_80" => Some(Target::Sm80),
            "sm_90" => Some(Target::Sm90),
            _ => None,
        }
    }

    /// Every target.
    pub const ALL: [Target; 2] = [Target::Sm80, Target::Sm90];
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
