//! `proxy_fences`: the `fence.proxy.async` a kernel author never writes. In a program that
//! issues `wgmma`, TMA stores or bulk copies to other blocks of its cluster, shared memory
//! written through the generic proxy (stores, `cp.async`) and then read by one of them needs, in the writing threads, a proxy fence after the write and before the
//! barrier that orders it before the read. This pass puts one before every barrier that generic
//! shared writes may precede: any since the previous barrier in program order, or a label
//! between them (a loop head or a join, reached from code the scan has not seen in order).
//! `KDA_DUMP=lower` prints the program after it.

use crate::thread_ir::*;

/// Inserts the proxy fences into `prog` (nothing when it has no `wgmma`, TMA store or bulk
/// copy to the cluster).
pub fn insert_proxy_fences(prog: &mut ThreadProgram) {
    if !prog.body.iter().any(|i| matches!(i.op, Op::Wgmma { .. } | Op::TmaStore { .. } | Op::BulkCopyToCluster { .. }))
    {
        return;
    }
    let body = std::mem::take(&mut prog.body);
    let mut out = Vec::with_capacity(body.len());
    let mut written = false;
    for inst in body {
        match &inst.op {
            Op::St { space: Space::Shared, .. } | Op::CpAsync { .. } | Op::CpAsyncWait { .. } | Op::Label(_) => {
                written = true
            }
            Op::Bar { .. } if written => {
                out.push(Inst { op: Op::FenceProxyAsync, guard: None, ..inst.clone() });
                written = false;
            }
            Op::Bar { .. } => {}
            _ => {}
        }
        out.push(inst);
    }
    prog.body = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::SrcLoc;

    fn inst(op: Op) -> Inst {
        Inst { op, guard: None, loc: SrcLoc::default(), cache: CachePolicy::Normal }
    }

    fn fences_before_barriers(ops: Vec<Op>) -> Vec<bool> {
        let mut p = ThreadProgram::of_body(128, ops.into_iter().map(inst).collect());
        insert_proxy_fences(&mut p);
        let ops: Vec<&Op> = p.body.iter().map(|i| &i.op).collect();
        ops.iter()
            .enumerate()
            .filter(|(_, o)| matches!(o, Op::Bar { .. }))
            .map(|(i, _)| i > 0 && matches!(ops[i - 1], Op::FenceProxyAsync))
            .collect()
    }

    /// A barrier after a shared store, a `cp.async` wait or a label gets a fence; one with only
    /// a barrier before it since does not; a program without `wgmma` gets none.
    #[test]
    fn fences_go_where_generic_writes_may_precede_a_barrier() {
        let r = Reg { class: RegClass::B32, id: 0 };
        let bar = || Op::Bar { id: Src::Imm(0), count: None, reach: BarrierReach::SameInstruction };
        let store = || Op::St { space: Space::Shared, ty: Ty::U32, addr: r, offset: 0, vals: vec![Src::Imm(1)] };
        let wgmma = || Op::WgmmaCommit;
        let with_wgmma = |mut ops: Vec<Op>| {
            ops.push(Op::Wgmma {
                ab: Ty::BF16,
                n: 8,
                d: vec![],
                a: WgmmaA::Registers([r; 4]),
                b: SharedOperand { desc: r, major: crate::hopper_layout::Major::K },
                accumulate: r,
            });
            ops.push(wgmma());
            ops
        };
        let fenced = fences_before_barriers(with_wgmma(vec![
            store(),
            bar(),
            bar(),
            Op::Label(1),
            bar(),
            Op::CpAsyncWait { n: 0 },
            bar(),
        ]));
        assert_eq!(fenced, [true, false, true, true]);
        assert_eq!(fences_before_barriers(vec![store(), bar()]), [false]);
    }
}
