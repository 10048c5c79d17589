//! Expressions on kernel values: operators, math functions, casts, element reads, `select`.

use super::*;

impl Cx {
    /// A kernel value expression, as code building a `Val`.
    pub(crate) fn val(&self, e: &Expr) -> syn::Result<TS> {
        if !self.is_dsl(e) {
            if let Expr::Lit(syn::ExprLit { lit: syn::Lit::Float(_) | syn::Lit::Int(_) | syn::Lit::Bool(_), .. }) = e {
                return Ok(quote!(::kda_dsl::builder::Val::from(#e)));
            }
            if let Some((name, _, _)) = call_name(e) {
                if MATH1.contains(&name.as_str())
                    || MATH2.contains(&name.as_str())
                    || name == "select"
                    || name == "ceil_div"
                {
                    return self.val_call(e);
                }
            }
            return Ok(quote!(::kda_dsl::builder::Val::from(#e)));
        }
        let vt = quote!(::kda_dsl::builder::Val);
        match e {
            Expr::Path(_) => match self.ident_kind(e) {
                Some((Kind::Val, id)) => Ok(quote!(#vt::from(&#id))),
                Some((Kind::Tensor, id)) => err(
                    id.span(),
                    format!("`{id}` is a global tensor; read an element as `{id}[i]` or a box with `copy`"),
                ),
                Some((Kind::Tiles, id)) => err(id.span(), format!("`{id}` is a struct of tiles, not a value")),
                Some((_, id)) => {
                    err(id.span(), format!("`{id}` is a tile; read an element as `{id}[i][j]` inside `parallel`"))
                }
                None => Ok(quote!(#vt::from(#e))),
            },
            Expr::Paren(p) => self.val(&p.expr),
            Expr::Group(g) => self.val(&g.expr),
            Expr::Binary(b) => {
                let (l, r) = (self.val(&b.left)?, self.val(&b.right)?);
                let op = match b.op {
                    syn::BinOp::Add(_) => quote!(Add),
                    syn::BinOp::Sub(_) => quote!(Sub),
                    syn::BinOp::Mul(_) => quote!(Mul),
                    syn::BinOp::Div(_) => quote!(Div),
                    syn::BinOp::Rem(_) => quote!(Rem),
                    syn::BinOp::Lt(_) => quote!(Lt),
                    syn::BinOp::Le(_) => quote!(Le),
                    syn::BinOp::Gt(_) => quote!(Gt),
                    syn::BinOp::Ge(_) => quote!(Ge),
                    syn::BinOp::Eq(_) => quote!(Eq),
                    syn::BinOp::Ne(_) => quote!(Ne),
                    syn::BinOp::And(_) => quote!(And),
                    syn::BinOp::Or(_) => quote!(Or),
                    o => return err(o.span(), "this operator is not supported on kernel values"),
                };
                Ok(quote!(#vt::bin(::kda_dsl::tile::BinOp::#op, #l, #r)))
            }
            Expr::Unary(u) => {
                let x = self.val(&u.expr)?;
                match u.op {
                    syn::UnOp::Neg(_) => Ok(quote!(#vt::un(::kda_dsl::tile::UnOp::Neg, #x))),
                    syn::UnOp::Not(_) => Ok(quote!(#vt::un(::kda_dsl::tile::UnOp::Not, #x))),
                    _ => err(u.op.span(), "`*` is not supported on kernel values"),
                }
            }
            Expr::Cast(c) => {
                let x = self.val(&c.expr)?;
                let t = match &*c.ty {
                    Type::Path(p) if p.path.segments.len() == 1 => p.path.segments[0].ident.to_string(),
                    o => return err(o.span(), "cast to f32, f16, bf16, i32 or i64"),
                };
                let d = match t.as_str() {
                    "f32" => quote!(F32),
                    "f16" => quote!(F16),
                    "bf16" => quote!(BF16),
                    "i32" => quote!(I32),
                    "i64" => quote!(I64),
                    _ => {
                        return err(
                            c.ty.span(),
                            format!("cannot cast a kernel value to `{t}`; use f32, f16, bf16, i32 or i64"),
                        )
                    }
                };
                Ok(quote!(#vt::cast(#x, ::kda_dsl::DType::#d)))
            }
            Expr::Index(_) => {
                let (base, idx) = self.index_chain(e)?;
                let lc = loc(e.span());
                let idx: Vec<TS> = idx.iter().map(|x| self.val(x)).collect::<syn::Result<_>>()?;
                match self.ident_kind(base) {
                    Some((Kind::Tensor, id)) => Ok(quote!(__kb.load(&#id, vec![#(#idx),*], #lc))),
                    Some((Kind::Tile, id)) => Ok(quote!(__kb.elem(&#id, vec![#(#idx),*], #lc))),
                    _ => err(base.span(), "only tiles and global tensors can be indexed"),
                }
            }
            Expr::If(i) => {
                let c = self.val(&i.cond)?;
                let then = block_value(&i.then_branch)?;
                let Some((_, els)) = &i.else_branch else {
                    return err(i.if_token.span, "an `if` value needs an `else`");
                };
                let els = match &**els {
                    Expr::Block(b) => block_value(&b.block)?,
                    o => o,
                };
                let (a, b) = (self.val(then)?, self.val(els)?);
                Ok(quote!(#vt::select(#c, #a, #b)))
            }
            Expr::Call(_) | Expr::MethodCall(_) => self.val_call(e),
            Expr::Field(_) => Ok(quote!(#vt::from(#e))),
            o => err(o.span(), "this expression is not supported on kernel values"),
        }
    }

    pub(crate) fn val_call(&self, e: &Expr) -> syn::Result<TS> {
        let vt = quote!(::kda_dsl::builder::Val);
        let (name, args, sp): (String, Vec<&Expr>, Span) = match e {
            Expr::Call(_) => {
                let Some((n, a, sp)) = call_name(e) else { return err(e.span(), "unsupported call on kernel values") };
                (n, a.iter().collect(), sp)
            }
            Expr::MethodCall(m) => {
                let mut a = vec![&*m.receiver];
                a.extend(m.args.iter());
                (m.method.to_string(), a, m.method.span())
            }
            _ => unreachable!(),
        };
        let arity = |n: usize| check_arity(&name, args.len(), n, sp);
        if MATH1.contains(&name.as_str()) {
            arity(1)?;
            let x = self.val(args[0])?;
            let op = match name.as_str() {
                "exp" => quote!(Exp),
                "exp2" => quote!(Exp2),
                "log" => quote!(Log),
                "sigmoid" => quote!(Sigmoid),
                "softplus" => quote!(Softplus),
                "rsqrt" => quote!(Rsqrt),
                "sqrt" => quote!(Sqrt),
                _ => quote!(Abs),
            };
            return Ok(quote!(#vt::un(::kda_dsl::tile::UnOp::#op, #x)));
        }
        if MATH2.contains(&name.as_str()) {
            arity(2)?;
            let (a, b) = (self.val(args[0])?, self.val(args[1])?);
            let op = if name == "max" { quote!(Max) } else { quote!(Min) };
            return Ok(quote!(#vt::bin(::kda_dsl::tile::BinOp::#op, #a, #b)));
        }
        if name == "ceil_div" {
            arity(2)?;
            let (a, b) = (self.val(args[0])?, self.val(args[1])?);
            let bin = quote!(::kda_dsl::tile::BinOp);
            return Ok(quote!({
                let (__a, __b) = (#a, #b);
                #vt::bin(#bin::Div, #vt::bin(#bin::Add, __a, #vt::bin(#bin::Sub, __b.clone(), 1)), __b)
            }));
        }
        if name == "select" {
            arity(3)?;
            let (c, a, b) = (self.val(args[0])?, self.val(args[1])?, self.val(args[2])?);
            return Ok(quote!(#vt::select(#c, #a, #b)));
        }
        if PRIMITIVES.contains(&name.as_str()) {
            return err(sp, format!("`{name}` is a tile operation, not a value"));
        }
        if let Expr::Call(c) = e {
            // A `#[kernel_fn]` helper returning `Val`, unless the name is a math function the
            // DSL does not have (where the list of those it has helps more than rustc's
            // "cannot find function").
            if !UNSUPPORTED_MATH.contains(&name.as_str()) {
                return self.helper_call(&name, &c.args, sp);
            }
        }
        err(
            sp,
            format!(
                "unknown function `{name}` on kernel values; math functions are {}, {}, select",
                MATH1.join(", "),
                MATH2.join(", ")
            ),
        )
    }
}
