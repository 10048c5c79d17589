//! Divisibility facts for index expressions: a number every value of an expression is a multiple
//! of. Copies use them to prove a box's first element aligned for vector accesses.

use crate::tile::*;
use std::collections::HashMap;

/// "Any multiple": the divisor of 0 (capped so products stay finite).
pub(crate) const ANY: u64 = 1 << 40;

pub(crate) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A number every value of `e` is a multiple of, given the same for variables (`var`) and
/// extents (`dim`). 1 when nothing is known.
pub(crate) fn expr_divisor(e: &Expr, var: &dyn Fn(VarId) -> u64, dim: &dyn Fn(ParamId) -> u64) -> u64 {
    let d = |x: &Expr| expr_divisor(x, var, dim);
    match e {
        Expr::Int(0, _) => ANY,
        Expr::Int(v, _) => v.unsigned_abs().min(ANY),
        Expr::Var(v) => var(*v),
        Expr::Dim(p) => dim(*p),
        Expr::Binary(BinOp::Mul, a, b) => d(a).saturating_mul(d(b)).min(ANY),
        Expr::Binary(BinOp::Add | BinOp::Sub | BinOp::Min | BinOp::Max, a, b) | Expr::Select(_, a, b) => {
            gcd(d(a), d(b))
        }
        _ => 1,
    }
}

/// Per assigned variable, a divisor of every value it takes: the largest divisors that every
/// assignment preserves when each variable it reads has its own (iterated down from "any" to a
/// fixpoint, so loop-carried and select-built indices keep what all their definitions share).
/// Variables never assigned (loop indices) are absent.
pub(crate) fn var_divisors(def: &KernelDef) -> HashMap<VarId, u64> {
    let mut assigns = vec![];
    collect_assignments(&def.body, &mut assigns);
    let mut div: HashMap<VarId, u64> = assigns.iter().map(|(v, _)| (*v, ANY)).collect();
    let dim = |p: ParamId| def.multiple_of(p) as u64;
    loop {
        let mut changed = false;
        for (v, e) in &assigns {
            let cur = div[v];
            let known = |x: VarId| div.get(&x).copied().unwrap_or(1);
            let next = gcd(cur, expr_divisor(e, &known, &dim));
            if next != cur {
                div.insert(*v, next);
                changed = true;
            }
        }
        if !changed {
            return div;
        }
    }
}

pub(crate) fn collect_assignments<'a>(body: &'a [Stmt], out: &mut Vec<(VarId, &'a Expr)>) {
    visit_stmts(body, &mut |s| {
        if let StmtKind::Assign(v, e) = &s.kind {
            out.push((*v, e));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{Host, KernelBuilder, Val};
    use crate::passes::testing::loc;

    fn int(v: i64) -> Expr {
        Expr::Int(v, None)
    }

    fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(op, Box::new(a), Box::new(b))
    }

    #[test]
    fn products_sums_and_selects() {
        let none = |_: VarId| 1;
        let dims = |_: ParamId| 8;
        let e = bin(BinOp::Mul, Expr::Var(VarId::new(0)), int(32));
        assert_eq!(expr_divisor(&e, &none, &dims), 32);
        let e = bin(BinOp::Add, bin(BinOp::Mul, Expr::Dim(ParamId::new(0)), int(4)), int(12));
        assert_eq!(expr_divisor(&e, &none, &dims), 4);
        let e = Expr::Select(Box::new(Expr::Bool(true)), Box::new(int(64)), Box::new(int(96)));
        assert_eq!(expr_divisor(&e, &none, &dims), 32);
        assert_eq!(expr_divisor(&int(0), &none, &dims), ANY);
        assert_eq!(expr_divisor(&bin(BinOp::Div, int(64), int(2)), &none, &dims), 1);
    }

    #[test]
    fn variables_keep_what_all_their_assignments_share() {
        let k = KernelBuilder::new("t", loc(1));
        k.launch(vec![Host::int(1)], 32, loc(2));
        let n = k.dim("N");
        // a = 32 N; b = a, then 48; c = 0, then c + a in a loop; d = 0, then d + 1.
        let a = k.let_var("a", Val::bin(BinOp::Mul, n, 32), loc(3));
        let b = k.let_var("b", a.clone(), loc(4));
        k.assign(&b, 48, loc(5));
        let c = k.let_var("c", 0, loc(6));
        let d = k.let_var("d", 0, loc(7));
        k.begin_for("i", LoopKind::Serial, 0, 4, loc(8));
        k.assign(&c, Val::bin(BinOp::Add, c.clone(), a.clone()), loc(9));
        k.assign(&d, Val::bin(BinOp::Add, d.clone(), 1), loc(10));
        k.end();
        let def = k.finish().expect("valid");
        let div = var_divisors(&def);
        let of = |name: &str| div[&def.vars.position(|v| v.name == name).expect("declared")];
        assert_eq!(of("a"), 32);
        assert_eq!(of("b"), 16);
        assert_eq!(of("c"), 32);
        assert_eq!(of("d"), 1);
    }
}
