//! `if`s lowered without a branch: every instruction of a short, straight-line body runs under
//! the condition's predicate.
//!
//! ptxas schedules within a basic block, so a branch around a load keeps the loads before and
//! after it from overlapping: a table filled with one guarded global load per entry waits a
//! full memory latency per entry. Guarded instructions stay in one block and issue together.

use super::Lower;
use crate::diag::Diag;
use crate::passes::{BufLayout, TileProgram};
use crate::thread_ir::Reg;
use crate::tile::{visit_stmts, Stmt, StmtKind};

/// Most statements (both arms, nested ones included) an `if` may hold to lose its branch: past
/// that, skipping the body beats issuing it under a false predicate.
const MAX_STATEMENTS: usize = 8;

/// Whether an `if` with arms `then` and `otherwise` lowers without a branch: both arms hold
/// only assignments, element stores and such `if`s, at most [`MAX_STATEMENTS`] in all, and
/// some arm stores to memory (shared or global). Tile operations, loops and barriers keep the
/// branch (they are long, or collective); so do arms that only set registers: their values are
/// used after the `if`, so their loads already overlap what follows it, and guarding them only
/// lengthens the registers' lives (it made the 168-register decode variant spill).
pub(crate) fn predicable(p: &TileProgram, then: &[Stmt], otherwise: &[Stmt]) -> bool {
    let mut stores_memory = false;
    let mut count = |body: &[Stmt]| -> Option<usize> {
        let mut n = 0;
        let mut simple = true;
        visit_stmts(body, &mut |s| {
            n += 1;
            match &s.kind {
                StmtKind::Assign(..) | StmtKind::If(..) => {}
                StmtKind::StoreGlobal(..) => stores_memory = true,
                StmtKind::Store(b, ..) => stores_memory |= matches!(p.layouts[*b], BufLayout::Shared(_)),
                _ => simple = false,
            }
        });
        simple.then_some(n)
    };
    let sizes = (count(then), count(otherwise));
    stores_memory && matches!(sizes, (Some(a), Some(b)) if a + b <= MAX_STATEMENTS)
}

impl Lower<'_> {
    /// Lowers `if p { then } else { otherwise }` with each arm's instructions guarded by its
    /// predicate (combined with the guard of an enclosing if-converted arm).
    pub(crate) fn if_converted(&mut self, p: Reg, then: &[Stmt], otherwise: &[Stmt]) -> Result<(), Diag> {
        let outer = self.em.guard;
        // Both guards are fresh registers, fixed before either arm runs: the condition may be a
        // variable that an arm assigns.
        let taken = match outer {
            Some(g) => self.em.and_unguarded(g, p),
            None => self.em.copy_unguarded(p),
        };
        let other = (!otherwise.is_empty()).then(|| match outer {
            // `outer && !p` is `outer != (outer && p)`.
            Some(g) => self.em.xor_unguarded(g, taken),
            None => self.em.not_unguarded(taken),
        });
        self.em.guard = Some(taken);
        let mut lowered = self.block(then);
        if let (Ok(()), Some(other)) = (&lowered, other) {
            self.em.guard = Some(other);
            lowered = self.block(otherwise);
        }
        self.em.guard = outer;
        lowered
    }
}
