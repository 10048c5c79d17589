//! Value ranges of index expressions. A block index runs below its grid extent, which is a known
//! constant when every extent the grid reads is assumed exact (`assume_extent`); a variable
//! assigned only from known ranges takes their union. Copies use the ranges to drop bound checks
//! a box can never fail (a 32-row box at `32 * blockIdx.z` of a 128-row axis, with a grid of
//! `128 / 32` blocks along z).

use super::divisibility::collect_assignments;
use crate::tile::*;
use std::collections::HashMap;

/// An inclusive range `(lo, hi)` of values.
pub(crate) type Range = (i64, i64);

/// The range of every variable that has one: block indices with a constant grid extent, and
/// variables all of whose assignments have ranges (iterated until no more become known, so a
/// variable that depends on itself never gets one).
pub(crate) fn var_ranges(def: &KernelDef) -> HashMap<VarId, Range> {
    let mut out = HashMap::new();
    let exact = |name: &str| {
        let p = def.params.position(|p| matches!(p, Param::Dim { name: n } if n == name))?;
        def.exact_extent(p)
    };
    let mut assigns: Vec<(VarId, &Expr)> = vec![];
    collect_assignments(&def.body, &mut assigns);
    for (axis, v) in def.block_vars.iter().enumerate() {
        // A block index the kernel reassigns leaves its grid range: it gets none.
        let reassigned = |v: &VarId| assigns.iter().any(|(x, _)| x == v);
        if let (Some(v), Some(n)) = (v.filter(|v| !reassigned(v)), def.grid[axis].eval(&exact)) {
            if n >= 1 {
                out.insert(v, (0, n - 1));
            }
        }
    }
    let dim = |p: ParamId| def.exact_extent(p);
    loop {
        let mut added = false;
        let mut pending: Vec<VarId> = assigns.iter().map(|(v, _)| *v).filter(|v| !out.contains_key(v)).collect();
        pending.sort_unstable();
        pending.dedup();
        for v in pending {
            let known = |x: VarId| out.get(&x).copied();
            let mut union: Option<Range> = None;
            let mut all = true;
            for (_, e) in assigns.iter().filter(|(w, _)| *w == v) {
                match expr_range(e, &known, &dim) {
                    Some((lo, hi)) => union = Some(union.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi)))),
                    None => all = false,
                }
            }
            if let (true, Some(r)) = (all, union) {
                out.insert(v, r);
                added = true;
            }
        }
        if !added {
            return out;
        }
    }
}

/// The range of `e`'s values given those of variables (`var`) and exact extents (`dim`);
/// `None` when unknown or when a bound would overflow.
pub(crate) fn expr_range(
    e: &Expr,
    var: &dyn Fn(VarId) -> Option<Range>,
    dim: &dyn Fn(ParamId) -> Option<i64>,
) -> Option<Range> {
    let r = |x: &Expr| expr_range(x, var, dim);
    match e {
        Expr::Int(v, _) => Some((*v, *v)),
        Expr::Var(v) => var(*v),
        Expr::Dim(p) => dim(*p).map(|v| (v, v)),
        Expr::Binary(op, a, b) => {
            let ((al, ah), (bl, bh)) = (r(a)?, r(b)?);
            match op {
                BinOp::Add => Some((al.checked_add(bl)?, ah.checked_add(bh)?)),
                BinOp::Sub => Some((al.checked_sub(bh)?, ah.checked_sub(bl)?)),
                BinOp::Mul => {
                    let p = [al.checked_mul(bl)?, al.checked_mul(bh)?, ah.checked_mul(bl)?, ah.checked_mul(bh)?];
                    Some((*p.iter().min()?, *p.iter().max()?))
                }
                BinOp::Min => Some((al.min(bl), ah.min(bh))),
                BinOp::Max => Some((al.max(bl), ah.max(bh))),
                _ => None,
            }
        }
        Expr::Select(_, a, b) => {
            let ((al, ah), (bl, bh)) = (r(a)?, r(b)?);
            Some((al.min(bl), ah.max(bh)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{Host, KernelBuilder, Val};
    use crate::passes::testing::loc;

    #[test]
    fn block_indices_and_what_is_built_from_them_have_ranges_when_the_grid_is_constant() {
        let k = KernelBuilder::new("r", loc(1));
        let n = k.dim("N");
        let m = k.dim("M");
        k.assume_extent(&n, 128, loc(2));
        let b = k.launch(vec![k.host_dim("M"), Host::ceil_div(k.host_dim("N"), Host::int(32))], 64, loc(3));
        // r0 = 32 z, q = r0 or 16 (a select), m0 = the x index (grid `M`: unknown), c = 0 then
        // c + 1 in a loop (depends on itself: unknown).
        let r0 = k.let_var("r0", Val::bin(BinOp::Mul, b[1].clone(), 32), loc(4));
        k.let_var("q", Val::select(Val::bin(BinOp::Lt, b[0].clone(), m), r0, 16), loc(5));
        k.let_var("m0", b[0].clone(), loc(6));
        let c = k.let_var("c", 0, loc(7));
        k.begin_for("i", LoopKind::Serial, 0, 4, loc(8));
        k.assign(&c, Val::bin(BinOp::Add, c.clone(), 1), loc(9));
        k.end();
        let def = k.finish().expect("valid");
        let ranges = var_ranges(&def);
        let of = |name: &str| ranges.get(&def.vars.position(|v| v.name == name).expect("declared")).copied();
        assert_eq!(of("r0"), Some((0, 96)));
        assert_eq!(of("q"), Some((0, 96)));
        assert_eq!(of("m0"), None);
        assert_eq!(of("c"), None);
    }

    #[test]
    fn arithmetic_bounds() {
        let none = |_: VarId| None;
        let dims = |_: ParamId| Some(128);
        let int = |v: i64| Expr::Int(v, None);
        let bin = |op, a, b| Expr::Binary(op, Box::new(a), Box::new(b));
        assert_eq!(expr_range(&bin(BinOp::Sub, Expr::Dim(ParamId::new(0)), int(32)), &none, &dims), Some((96, 96)));
        assert_eq!(expr_range(&bin(BinOp::Mul, int(-2), Expr::Dim(ParamId::new(0))), &none, &dims), Some((-256, -256)));
        assert_eq!(expr_range(&bin(BinOp::Div, Expr::Dim(ParamId::new(0)), int(2)), &none, &dims), None);
        assert_eq!(expr_range(&Expr::Var(VarId::new(0)), &none, &dims), None);
        assert_eq!(expr_range(&bin(BinOp::Mul, int(i64::MAX), int(2)), &none, &dims), None);
    }
}
