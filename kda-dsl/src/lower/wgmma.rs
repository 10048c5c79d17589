//! Lowering of a `gemm` planned on `wgmma` (sm_90a): each warpgroup multiplies its 64
//! accumulator rows by all N columns, one `wgmma.mma_async.m64nNk16` per K-step (and per
//! 16-row block of each warp, where a warp holds more: A then comes from registers). The operands'
//! descriptors are the tile's constant fields (`hopper_layout`) plus its shared address, which
//! moves with a pipeline's stage; an A fragment is packed to 16-bit pairs as for `mma.sync`.
//! The instructions sit between a `wgmma.fence` (the accumulator was written by other
//! instructions: a clear, an earlier product's epilogue) and a commit of their group, waited for
//! before the first statement that needs it (`wgmma_waits.rs`). The shared operands' generic
//! writes reach the async proxy through the fences `proxy_fences.rs` places.

use super::gemm_plan::{WgmmaPlan, WgmmaSource};
use super::{Lower, WgmmaWait};
use crate::hopper_layout::{Major, OperandTile};
use crate::thread_ir::*;
use crate::tile::*;

/// Accumulator rows a warpgroup owns.
const WARPGROUP_ROWS: u32 = 64;

impl Lower<'_> {
    /// `gemm` on `wgmma`, as `p` plans it.
    pub(super) fn wgmma(&mut self, a: &Operand, b: &Operand, c: BufId, p: &WgmmaPlan) {
        let warpgroup = self.em.op32(BinKind::Shr, self.scope.th.warp, 2);
        // The descriptors' run-time part: each tile's shared address (this stage's), in 16-byte
        // units; A's from its warpgroup's first row.
        let b_field = self.descriptor_address(b.buf, None);
        let a_field = match p.a {
            WgmmaSource::Shared(tile) => Some((tile, self.descriptor_address(a.buf, Some((tile, warpgroup))))),
            WgmmaSource::Registers(_) | WgmmaSource::ReplicatedRows => None,
        };
        let always = self.em.setp(Cmp::Ge, Ty::U32, Src::Reg(self.scope.th.tid), Src::Imm(0));
        // Row block `i`'s accumulator registers: the layout's slots of its `i`-th 16 rows.
        let per_block = (p.n / 2) as usize;
        let d_of = |lw: &Self, i: u32| lw.regs[c][i as usize * per_block..(i as usize + 1) * per_block].to_vec();
        let d = d_of(self, 0);
        // `wgmma` may read its A registers only as a `wgmma.fence` left them: every K-step's A
        // (its descriptor, or its registers packed to 16-bit pairs) is made before one fence.
        // A fence between two `wgmma`s into one accumulator makes ptxas wait for the first
        // before the second (C7517): the K-steps would no longer overlap.
        match (a_field, p.a) {
            (Some((tile, field)), _) => {
                let operands: Vec<(WgmmaA, SharedOperand)> = (0..p.k / 16)
                    .map(|step| {
                        let a_operand = WgmmaA::Shared(self.descriptor(tile, field, step));
                        (a_operand, self.descriptor(p.b, b_field, step))
                    })
                    .collect();
                self.em.emit(Op::WgmmaFence);
                for (a_operand, b_operand) in operands {
                    let op =
                        Op::Wgmma { ab: p.ty, n: p.n, d: d.clone(), a: a_operand, b: b_operand, accumulate: always };
                    self.em.emit(op);
                }
            }
            (None, WgmmaSource::Registers(layout)) => {
                let b_operands: Vec<SharedOperand> =
                    (0..p.k / 16).map(|step| self.descriptor(p.b, b_field, step)).collect();
                // One row block at a time: its K-steps' A packed, one fence, its `wgmma`s. A
                // fence between two row blocks' instructions (other accumulators) costs no wait,
                // and only one block's A is live at once.
                for block in 0..p.row_blocks {
                    let a_operands: Vec<WgmmaA> = (0..p.k / 16)
                        .map(|step| WgmmaA::Registers(self.pack_a(a.buf, layout, block, step, p.ty)))
                        .collect();
                    self.em.emit(Op::WgmmaFence);
                    let d = d_of(self, block);
                    for (a_operand, b_operand) in a_operands.into_iter().zip(b_operands.iter().copied()) {
                        let op = Op::Wgmma {
                            ab: p.ty,
                            n: p.n,
                            d: d.clone(),
                            a: a_operand,
                            b: b_operand,
                            accumulate: always,
                        };
                        self.em.emit(op);
                    }
                }
            }
            (None, WgmmaSource::ReplicatedRows) => {
                // Every warp loads the tile's 16 rows as `mma.sync`'s A: lane `l` addresses row
                // `l % 16` at column `8 (l / 16)` of each K-step.
                let lane = Src::Reg(self.scope.th.lane);
                let row = self.em.op32(BinKind::And, lane, 15);
                let half = self.em.op32(BinKind::Shr, lane, 4);
                let col0 = self.em.op32(BinKind::Shl, half, 3);
                for step in 0..p.k / 16 {
                    let col = self.em.add32(col0, Src::Imm(i64::from(16 * step)));
                    let addr = self.shared_addr(a.buf, row, col);
                    let regs = [0; 4].map(|_| self.em.reg(RegClass::B32));
                    self.em.emit(Op::Ldmatrix { trans: false, d: regs.to_vec(), addr });
                    let b_operand = self.descriptor(p.b, b_field, step);
                    self.em.emit(Op::WgmmaFence);
                    let op = Op::Wgmma {
                        ab: p.ty,
                        n: p.n,
                        d: d.clone(),
                        a: WgmmaA::Registers(regs),
                        b: b_operand,
                        accumulate: always,
                    };
                    self.em.emit(op);
                }
            }
            (None, WgmmaSource::Shared(_)) => unreachable!("a shared A has its address"),
        }
        self.em.emit(Op::WgmmaCommit);
        // Whole at the next statement, or (a pipelined loop keeping its group in flight) the
        // previous iteration's group retired; or waited for where its body's plan says
        // (`wgmma_waits`).
        match self.wgmma_wait {
            WgmmaWait::Whole => self.em.emit(Op::WgmmaWait { n: 0 }),
            WgmmaWait::KeepLatest => self.em.emit(Op::WgmmaWait { n: 1 }),
            WgmmaWait::Planned => {}
        }
    }

    /// The 64-bit start-address field of shared tile `buf`'s descriptors: its address (the
    /// current stage's) over 16; for A, from warpgroup `wg`'s first of M.
    fn descriptor_address(&mut self, buf: BufId, a_rows: Option<(OperandTile, Src)>) -> Reg {
        let mut addr = Src::Reg(self.shared_addr(buf, Src::Imm(0), Src::Imm(0)));
        if let Some((tile, wg)) = a_rows {
            // Warpgroup `wg`'s A starts `wg` times warpgroup 1's offset: rows a line apart in a
            // K-major tile; in an MN-major one, M in slabs of a line, so (with two warpgroups
            // or more, M spans whole 128-byte slabs) whole slabs apart.
            let first = match tile {
                OperandTile::K(t) => t.logical_offset(WARPGROUP_ROWS, 0),
                OperandTile::MN(t) => t.logical_offset(WARPGROUP_ROWS, 0),
            };
            let off = self.em.mul32(wg, Src::Imm(i64::from(first)));
            addr = self.em.add32(addr, off);
        }
        let units = self.em.op32(BinKind::Shr, addr, 4);
        let wide = self.em.reg(RegClass::B64);
        self.em.emit(Op::Cvt { dty: Ty::U64, sty: Ty::U32, d: wide, a: units });
        wide
    }

    /// The descriptor of `tile` for K-step `step`: its constant fields (encoded at address 0)
    /// plus the run-time address field, which never carries out of its 14 bits (shared
    /// addresses stay below 256 KiB).
    fn descriptor(&mut self, tile: OperandTile, field: Reg, step: u32) -> SharedOperand {
        let constant = tile.descriptor(0, step).encode() as i64;
        let desc = self.em.bin(BinKind::Add, Ty::S64, RegClass::B64, Src::Reg(field), Src::Imm(constant));
        let major = match tile {
            OperandTile::K(_) => Major::K,
            OperandTile::MN(_) => Major::MN,
        };
        SharedOperand { desc, major }
    }
}
