//! The `#[kernel]` front end of the kda tile DSL.
//!
//! A kernel is a Rust function whose first parameter is its config (`cfg: &Config`), followed
//! by global tensors (`a: Global<(M, K), {cfg.dtype}>`, `c: GlobalMut<..>`) and scalars
//! (`scale: f32`). The attribute turns it into `fn name(cfg: &Config) -> Result<KernelDef, Diag>`
//! that records the kernel with `kda_dsl::builder`. Expressions that use no kernel value are
//! ordinary Rust evaluated when the kernel is specialized (so config loops unroll and config
//! branches vanish); the rest become kernel IR. Every mistake the front end can see is a
//! compile error at the user's token.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TS};
use quote::{quote, quote_spanned};
use std::collections::HashMap;
use syn::spanned::Spanned;
use syn::{parse_macro_input, Expr, FnArg, GenericArgument, ItemFn, Pat, PathArguments, Stmt, Type};

/// Marks a function as a tile kernel. See the crate docs for the accepted forms.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        let a: TS = attr.into();
        return syn::Error::new(a.span(), "#[kernel] takes no arguments").to_compile_error().into();
    }
    let f = parse_macro_input!(item as ItemFn);
    match expand(f) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Tensor,
    Tile,
    Val,
    Host,
}

struct Cx {
    scopes: Vec<HashMap<String, Kind>>,
    dims: Vec<String>,
    in_parallel: usize,
}

fn err<T>(span: Span, msg: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new(span, msg))
}

fn loc(span: Span) -> TS {
    quote_spanned!(span=> ::kda_dsl::diag::SrcLoc::new(::core::file!(), ::core::line!(), ::core::column!()))
}

const PRIMITIVES: &[&str] = &[
    "copy",
    "gemm",
    "clear",
    "fill",
    "reduce_sum",
    "reduce_max",
    "cumsum",
    "print",
    "assume_multiple",
    "assume_extent",
];
const MATH1: &[&str] = &["exp", "exp2", "log", "sigmoid", "softplus", "rsqrt", "sqrt", "abs"];
const MATH2: &[&str] = &["max", "min"];

fn expand(f: ItemFn) -> syn::Result<TS> {
    let name = &f.sig.ident;
    let vis = &f.vis;
    let attrs = &f.attrs;
    if !f.sig.generics.params.is_empty() {
        return err(f.sig.generics.span(), "a kernel takes no generic parameters; put choices in its config");
    }
    if let syn::ReturnType::Type(_, t) = &f.sig.output {
        return err(t.span(), "a kernel returns nothing; write results with `copy` into a GlobalMut tensor");
    }
    let mut inputs = f.sig.inputs.iter();
    let (cfg_pat, cfg_ty) = match inputs.next() {
        Some(FnArg::Typed(pt)) if matches!(&*pt.ty, Type::Reference(_)) => (&pt.pat, &pt.ty),
        Some(a) => return err(a.span(), "the first parameter of a kernel must be its config, as `cfg: &Config`"),
        None => return err(f.sig.span(), "a kernel needs a config parameter first, as `cfg: &Config`"),
    };
    let mut cx = Cx { scopes: vec![HashMap::new()], dims: vec![], in_parallel: 0 };
    let mut prelude = vec![];
    for a in inputs {
        let FnArg::Typed(pt) = a else { return err(a.span(), "a kernel is a free function") };
        let Pat::Ident(pi) = &*pt.pat else { return err(pt.pat.span(), "expected a parameter name") };
        let pname = pi.ident.to_string();
        let ident = &pi.ident;
        match &*pt.ty {
            Type::Path(tp)
                if tp.path.segments.len() == 1
                    && matches!(tp.path.segments[0].ident.to_string().as_str(), "f32" | "i32" | "i64") =>
            {
                let d = match tp.path.segments[0].ident.to_string().as_str() {
                    "f32" => quote!(::kda_dsl::DType::F32),
                    "i32" => quote!(::kda_dsl::DType::I32),
                    _ => quote!(::kda_dsl::DType::I64),
                };
                prelude.push(quote!(let #ident = __kb.scalar(#pname, #d);));
                cx.bind(&pname, Kind::Val);
            }
            // An extent no tensor carries (a count the launcher passes, sizing the grid).
            Type::Path(tp) if tp.path.is_ident("Dim") => {
                if !cx.dims.contains(&pname) {
                    cx.dims.push(pname.clone());
                    prelude.push(quote!(let #ident = __kb.dim(#pname);));
                    cx.bind(&pname, Kind::Val);
                }
            }
            Type::Path(tp)
                if tp.path.segments.len() == 1
                    && matches!(tp.path.segments[0].ident.to_string().as_str(), "Global" | "GlobalMut") =>
            {
                let seg = &tp.path.segments[0];
                let writes = seg.ident == "GlobalMut";
                let PathArguments::AngleBracketed(ab) = &seg.arguments else {
                    return err(seg.span(), "expected `Global<(D0, D1, ..), {dtype}>`");
                };
                if ab.args.len() != 2 {
                    return err(
                        ab.span(),
                        "expected two arguments: the extents `(D0, D1, ..)` and the element type `{dtype}`",
                    );
                }
                let dims: Vec<syn::Ident> = match &ab.args[0] {
                    GenericArgument::Type(Type::Tuple(t)) => {
                        t.elems.iter().map(dim_ident).collect::<syn::Result<_>>()?
                    }
                    GenericArgument::Type(Type::Paren(p)) => vec![dim_ident(&p.elem)?],
                    other => return err(other.span(), "the extents are a tuple of symbols, as `(M, K)`"),
                };
                if dims.is_empty() {
                    return err(ab.args[0].span(), "a tensor needs at least one extent");
                }
                let dtype = match &ab.args[1] {
                    GenericArgument::Const(e) => quote!(#e),
                    GenericArgument::Type(t) => quote!(#t),
                    other => return err(other.span(), "the element type is `{expr}` or a name such as `BF16`"),
                };
                let dim_names: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
                for (d, id) in dim_names.iter().zip(&dims) {
                    if !cx.dims.contains(d) {
                        cx.dims.push(d.clone());
                        prelude.push(quote!(let #id = __kb.dim(#d);));
                        cx.bind(d, Kind::Val);
                    }
                }
                prelude.push(quote!(let #ident = __kb.tensor(#pname, &[#(#dim_names),*], #dtype, #writes);));
                cx.bind(&pname, Kind::Tensor);
            }
            other => {
                return err(
                    other.span(),
                    "a kernel parameter is `Global<(..), {dtype}>`, `GlobalMut<(..), {dtype}>`, `Dim`, `f32`, `i32` or `i64`",
                );
            }
        }
    }
    let body = cx.block_stmts(&f.block.stmts)?;
    let kname = name.to_string();
    let kloc = loc(name.span());
    Ok(quote! {
        #(#attrs)*
        #[allow(non_snake_case, unused_variables, unused_mut, unused_braces, clippy::all)]
        #vis fn #name(#cfg_pat: #cfg_ty) -> ::core::result::Result<::kda_dsl::tile::KernelDef, ::kda_dsl::diag::Diag> {
            #[allow(unused_imports)]
            use ::kda_dsl::dtype::DType::{BF16, F16, F32, I32, I64};
            let __kb = ::kda_dsl::builder::KernelBuilder::new(#kname, #kloc);
            #(#prelude)*
            #body
            __kb.finish()
        }
    })
}

fn dim_ident(t: &Type) -> syn::Result<syn::Ident> {
    match t {
        Type::Path(p) if p.path.segments.len() == 1 && p.path.segments[0].arguments.is_empty() => {
            Ok(p.path.segments[0].ident.clone())
        }
        other => err(other.span(), "an extent is a symbol such as `M`"),
    }
}

fn call_name(e: &Expr) -> Option<(String, &syn::punctuated::Punctuated<Expr, syn::token::Comma>, Span)> {
    if let Expr::Call(c) = e {
        if let Expr::Path(p) = &*c.func {
            if p.path.segments.len() == 1 {
                return Some((p.path.segments[0].ident.to_string(), &c.args, c.func.span()));
            }
        }
    }
    None
}

/// Splits `name = value` keyword arguments from positional ones.
fn kwargs(args: &syn::punctuated::Punctuated<Expr, syn::token::Comma>) -> (Vec<&Expr>, Vec<(String, &Expr, Span)>) {
    let mut pos = vec![];
    let mut kw = vec![];
    for a in args {
        match a {
            Expr::Assign(asg) => match &*asg.left {
                Expr::Path(p) if p.path.segments.len() == 1 => {
                    kw.push((p.path.segments[0].ident.to_string(), &*asg.right, asg.left.span()))
                }
                _ => pos.push(a),
            },
            _ => pos.push(a),
        }
    }
    (pos, kw)
}

impl Cx {
    fn bind(&mut self, name: &str, k: Kind) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name.to_string(), k);
        }
    }

    fn kind(&self, name: &str) -> Option<Kind> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    fn ident_kind(&self, e: &Expr) -> Option<(Kind, syn::Ident)> {
        if let Expr::Path(p) = e {
            if p.path.segments.len() == 1 && p.qself.is_none() {
                let id = p.path.segments[0].ident.clone();
                return self.kind(&id.to_string()).filter(|k| *k != Kind::Host).map(|k| (k, id));
            }
        }
        None
    }

    /// True when `e` mentions a kernel value (so it is kernel IR, not host Rust).
    fn is_dsl(&self, e: &Expr) -> bool {
        struct V<'a> {
            cx: &'a Cx,
            found: bool,
        }
        impl<'ast> syn::visit::Visit<'ast> for V<'_> {
            fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
                if p.path.segments.len() == 1 {
                    if let Some(k) = self.cx.kind(&p.path.segments[0].ident.to_string()) {
                        if k != Kind::Host {
                            self.found = true;
                        }
                    }
                }
            }
            fn visit_expr_field(&mut self, f: &'ast syn::ExprField) {
                // `cfg.x`: only the base matters.
                syn::visit::visit_expr(self, &f.base);
            }
        }
        let mut v = V { cx: self, found: false };
        syn::visit::Visit::visit_expr(&mut v, e);
        v.found
    }

    fn block_stmts(&mut self, stmts: &[Stmt]) -> syn::Result<TS> {
        self.scopes.push(HashMap::new());
        let mut out = vec![];
        for (i, s) in stmts.iter().enumerate() {
            match s {
                Stmt::Local(l) if self.becomes_kernel_var(l, &stmts[i + 1..]) => out.push(self.kernel_var(l)?),
                _ => out.push(self.stmt(s)?),
            }
        }
        self.scopes.pop();
        Ok(quote!(#(#out)*))
    }

    /// `let mut x = <host value>;` later assigned a kernel value is a kernel variable.
    fn becomes_kernel_var(&self, l: &syn::Local, rest: &[Stmt]) -> bool {
        let Pat::Ident(pi) = &l.pat else { return false };
        if pi.mutability.is_none() || l.init.as_ref().is_none_or(|i| self.is_dsl(&i.expr)) {
            return false;
        }
        struct Find<'a> {
            cx: &'a Cx,
            name: String,
            found: bool,
        }
        impl<'ast> syn::visit::Visit<'ast> for Find<'_> {
            fn visit_expr_assign(&mut self, a: &'ast syn::ExprAssign) {
                self.check(&a.left, &a.right);
                syn::visit::visit_expr_assign(self, a);
            }
            fn visit_expr_binary(&mut self, b: &'ast syn::ExprBinary) {
                if is_compound(&b.op) {
                    self.check(&b.left, &b.right);
                }
                syn::visit::visit_expr_binary(self, b);
            }
        }
        impl Find<'_> {
            /// True when `e` names a lowercase variable bound only later (a kernel `let` in a
            /// nested block, say); a host value would be in scope already.
            fn later_name(&self, e: &Expr) -> bool {
                struct Names(Vec<String>);
                impl<'ast> syn::visit::Visit<'ast> for Names {
                    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
                        if let Some(id) = p.path.get_ident() {
                            self.0.push(id.to_string());
                        }
                    }
                }
                let mut n = Names(vec![]);
                syn::visit::Visit::visit_expr(&mut n, e);
                n.0.iter().any(|x| x.starts_with(|c: char| c.is_lowercase()) && self.cx.kind(x).is_none())
            }
            fn check(&mut self, left: &Expr, right: &Expr) {
                if let Expr::Path(p) = left {
                    if p.path.is_ident(&self.name)
                        && (self.cx.is_dsl(right) || matches!(right, Expr::Index(_)) || self.later_name(right))
                    {
                        self.found = true;
                    }
                }
            }
        }
        let mut f = Find { cx: self, name: pi.ident.to_string(), found: false };
        for s in rest {
            syn::visit::Visit::visit_stmt(&mut f, s);
        }
        f.found
    }

    fn kernel_var(&mut self, l: &syn::Local) -> syn::Result<TS> {
        let Pat::Ident(pi) = &l.pat else { return err(l.pat.span(), "a kernel variable is one name") };
        let Some(init) = &l.init else { return err(l.span(), "a kernel `let` needs a value") };
        let v = self.val(&init.expr)?;
        let id = &pi.ident;
        let n = id.to_string();
        let lc = loc(init.expr.span());
        self.bind(&n, Kind::Val);
        Ok(quote!(let #id = __kb.let_var(#n, #v, #lc);))
    }

    fn stmt(&mut self, s: &Stmt) -> syn::Result<TS> {
        match s {
            Stmt::Local(l) => self.local(l),
            Stmt::Expr(e, _) => self.expr_stmt(e),
            Stmt::Item(i) => Ok(quote!(#i)),
            Stmt::Macro(m) => {
                let tokens = m.mac.tokens.to_string();
                for (name, k) in self.scopes.iter().flat_map(|s| s.iter()) {
                    if *k != Kind::Host && tokens.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == name) {
                        return err(
                            m.span(),
                            format!(
                                "macros cannot see kernel values such as `{name}`; use `print(tile)` to look at a tile"
                            ),
                        );
                    }
                }
                Ok(quote!(#m))
            }
        }
    }

    fn local(&mut self, l: &syn::Local) -> syn::Result<TS> {
        let Some(init) = &l.init else {
            return err(l.span(), "a kernel `let` needs a value");
        };
        if init.diverge.is_some() {
            return err(l.span(), "`let .. else` is not supported in a kernel");
        }
        let e = &*init.expr;
        let span = e.span();
        let lc = loc(span);
        if let Some((name, args, fspan)) = call_name(e) {
            match name.as_str() {
                "launch" => return self.launch(&l.pat, args, fspan),
                "shared" | "fragment" | "local" => {
                    let Pat::Ident(pi) = &l.pat else {
                        return err(l.pat.span(), "name the tile: `let x = shared(..)`");
                    };
                    let id = &pi.ident;
                    let (pos, kw) = kwargs(args);
                    if !kw.is_empty() || pos.len() != 2 {
                        return err(fspan, format!("`{name}` takes two arguments: `[extents]` and the element type"));
                    }
                    let Expr::Array(arr) = pos[0] else {
                        return err(pos[0].span(), "tile extents are an array such as `[cfg.bm, cfg.bk]`");
                    };
                    let mut ext = vec![];
                    for x in &arr.elems {
                        if self.is_dsl(x) {
                            return err(
                                x.span(),
                                "tile extents must be known when the kernel is specialized; this uses a kernel value",
                            );
                        }
                        ext.push(quote!((#x) as i64));
                    }
                    let dt = pos[1];
                    if self.is_dsl(dt) {
                        return err(dt.span(), "the element type must be known when the kernel is specialized");
                    }
                    let method = syn::Ident::new(&name, fspan);
                    let n = id.to_string();
                    self.bind(&n, Kind::Tile);
                    return Ok(quote!(let #id = __kb.#method(#n, &[#(#ext),*], #dt, #lc);));
                }
                _ => {}
            }
        }
        if self.is_dsl(e) {
            let Pat::Ident(pi) = &l.pat else {
                return err(l.pat.span(), "a kernel value binds to one name");
            };
            let id = &pi.ident;
            let n = id.to_string();
            if let Some((k, _)) = self.ident_kind(e) {
                if k == Kind::Tensor || k == Kind::Tile {
                    self.bind(&n, k);
                    return Ok(quote!(let #id = #e;));
                }
            }
            let v = self.val(e)?;
            self.bind(&n, Kind::Val);
            return Ok(quote!(let #id = __kb.let_var(#n, #v, #lc);));
        }
        // Host value: plain Rust; its names shadow kernel names.
        self.bind_pat_host(&l.pat);
        Ok(quote!(#l))
    }

    fn bind_pat_host(&mut self, p: &Pat) {
        match p {
            Pat::Ident(i) => self.bind(&i.ident.to_string(), Kind::Host),
            Pat::Tuple(t) => t.elems.iter().for_each(|e| self.bind_pat_host(e)),
            Pat::Type(t) => self.bind_pat_host(&t.pat),
            _ => {}
        }
    }

    fn launch(
        &mut self,
        pat: &Pat,
        args: &syn::punctuated::Punctuated<Expr, syn::token::Comma>,
        span: Span,
    ) -> syn::Result<TS> {
        let (pos, kw) = kwargs(args);
        if let Some(p) = pos.first() {
            return err(p.span(), "`launch` takes `grid = [..]` and `threads = n`");
        }
        let mut grid = None;
        let mut threads = None;
        let mut min_blocks = None;
        for (k, v, sp) in kw {
            match k.as_str() {
                "grid" => grid = Some(v),
                "threads" => threads = Some(v),
                "min_blocks" => min_blocks = Some(v),
                _ => {
                    return err(
                        sp,
                        format!("unknown `launch` argument `{k}`; expected `grid`, `threads` or `min_blocks`"),
                    )
                }
            }
        }
        let (Some(grid), Some(threads)) = (grid, threads) else {
            return err(span, "`launch` needs both `grid = [..]` and `threads = n`");
        };
        let Expr::Array(garr) = grid else { return err(grid.span(), "the grid is an array of 1 to 3 extents") };
        let g: Vec<TS> = garr.elems.iter().map(|x| self.host_expr(x)).collect::<syn::Result<_>>()?;
        if self.is_dsl(threads) {
            return err(threads.span(), "the thread count must be known when the kernel is specialized");
        }
        let names: Vec<syn::Ident> = match pat {
            Pat::Ident(i) => vec![i.ident.clone()],
            Pat::Tuple(t) => t
                .elems
                .iter()
                .map(|p| match p {
                    Pat::Ident(i) => Ok(i.ident.clone()),
                    Pat::Wild(w) => Ok(syn::Ident::new("_", w.span())),
                    o => err(o.span(), "expected a name for the block index"),
                })
                .collect::<syn::Result<_>>()?,
            Pat::Wild(_) => vec![],
            o => return err(o.span(), "bind the block indices as `let (bx, by) = launch(..)`"),
        };
        if names.len() > garr.elems.len() {
            return err(pat.span(), format!("{} block indices for a grid of {} axes", names.len(), garr.elems.len()));
        }
        let lc = loc(span);
        let mut binds = vec![];
        for (i, n) in names.iter().enumerate() {
            if n != "_" {
                self.bind(&n.to_string(), Kind::Val);
                binds.push(quote!(let #n = __blk[#i].clone();));
            }
        }
        let min_blocks = match min_blocks {
            Some(m) if self.is_dsl(m) => {
                return err(m.span(), "`min_blocks` must be known when the kernel is specialized")
            }
            Some(m) => quote!(__kb.min_blocks_per_sm(#m, #lc);),
            None => quote!(),
        };
        Ok(quote! {
            let __blk = __kb.launch(vec![#(#g),*], #threads, #lc);
            #min_blocks
            #(#binds)*
        })
    }

    /// A grid term: extents, config values, `+ - * /` and `ceil_div`.
    fn host_expr(&self, e: &Expr) -> syn::Result<TS> {
        match e {
            Expr::Path(p)
                if p.path.segments.len() == 1
                    && self.dims.contains(&p.path.segments[0].ident.to_string())
                    && self.kind(&p.path.segments[0].ident.to_string()) == Some(Kind::Val) =>
            {
                let n = p.path.segments[0].ident.to_string();
                Ok(quote!(__kb.host_dim(#n)))
            }
            Expr::Paren(p) => self.host_expr(&p.expr),
            Expr::Binary(b) if self.is_dsl(e) => {
                let (l, r) = (self.host_expr(&b.left)?, self.host_expr(&b.right)?);
                let op = &b.op;
                match b.op {
                    syn::BinOp::Add(_) | syn::BinOp::Sub(_) | syn::BinOp::Mul(_) | syn::BinOp::Div(_) => {
                        Ok(quote!((#l #op #r)))
                    }
                    _ => err(b.op.span(), "the grid uses + - * / and ceil_div only"),
                }
            }
            Expr::Call(_) if self.is_dsl(e) => {
                let Some((name, args, sp)) = call_name(e) else { return err(e.span(), "unsupported grid term") };
                if name != "ceil_div" || args.len() != 2 {
                    return err(sp, "the grid uses + - * / and ceil_div(a, b) only");
                }
                let (a, b) = (self.host_expr(&args[0])?, self.host_expr(&args[1])?);
                Ok(quote!(::kda_dsl::builder::Host::ceil_div(#a, #b)))
            }
            _ if self.is_dsl(e) => err(e.span(), "the grid may use tensor extents and config values only"),
            _ => Ok(quote!(::kda_dsl::builder::Host::int(#e))),
        }
    }

    fn expr_stmt(&mut self, e: &Expr) -> syn::Result<TS> {
        let span = e.span();
        let lc = loc(span);
        match e {
            Expr::Call(_) => {
                let Some((name, args, fspan)) = call_name(e) else {
                    if self.is_dsl(e) {
                        return err(span, "unsupported call in a kernel");
                    }
                    return Ok(quote!(#e;));
                };
                self.primitive(&name, args, fspan, lc)
            }
            Expr::ForLoop(f) => self.for_loop(f),
            Expr::If(i) => self.if_stmt(i),
            Expr::Block(b) => {
                let inner = self.block_stmts(&b.block.stmts)?;
                Ok(quote!({ #inner }))
            }
            Expr::Assign(a) => self.assign(&a.left, &a.right, None, lc),
            Expr::Binary(b) if is_compound(&b.op) => self.assign(&b.left, &b.right, Some(&b.op), lc),
            Expr::While(w) => {
                err(w.while_token.span, "`while` is not supported in a kernel; use `for i in serial(a, b)`")
            }
            Expr::Loop(l) => err(l.loop_token.span, "`loop` is not supported in a kernel; use `for i in serial(a, b)`"),
            Expr::Match(m) => err(m.match_token.span, "`match` is not supported in a kernel; use `if`"),
            Expr::Return(r) => err(r.return_token.span, "`return` is not supported in a kernel; branch with `if`"),
            Expr::Break(b) => err(b.break_token.span, "`break` is not supported in a kernel"),
            Expr::Continue(c) => err(c.continue_token.span, "`continue` is not supported in a kernel"),
            Expr::Closure(c) => err(c.span(), "closures are not supported in a kernel"),
            Expr::MethodCall(m) if self.is_dsl(e) => {
                err(m.method.span(), format!("`.{}()` does nothing as a statement in a kernel", m.method))
            }
            _ if self.is_dsl(e) => err(span, "this kernel expression does nothing as a statement"),
            Expr::Macro(m) => Ok(quote!(#m;)),
            _ => Ok(quote!(#e;)),
        }
    }

    fn tile_arg(&self, e: &Expr, what: &str) -> syn::Result<TS> {
        match self.ident_kind(e) {
            Some((Kind::Tile, id)) => Ok(quote!(&#id)),
            Some((Kind::Tensor, id)) => {
                err(id.span(), format!("`{id}` is a global tensor; {what} needs a tile (shared, fragment or local)"))
            }
            Some((_, id)) => err(id.span(), format!("`{id}` is a scalar; {what} needs a tile")),
            None => err(e.span(), format!("{what} needs a tile name here")),
        }
    }

    fn region(&self, e: &Expr) -> syn::Result<TS> {
        match e {
            Expr::MethodCall(m) => {
                let name = m.method.to_string();
                let lc = loc(m.method.span());
                match name.as_str() {
                    "tile" | "tile_at" => {
                        let Some((Kind::Tensor, id)) = self.ident_kind(&m.receiver) else {
                            if let Some((k, id)) = self.ident_kind(&m.receiver) {
                                let kind = if k == Kind::Tile { "a tile" } else { "a scalar" };
                                return err(
                                    id.span(),
                                    format!(
                                        "`{id}` is {kind}, not a global tensor; `.{name}(..)` boxes a global tensor"
                                    ),
                                );
                            }
                            return err(
                                m.receiver.span(),
                                format!("`.{name}(..)` applies to a global tensor parameter"),
                            );
                        };
                        if m.args.len() != 2 {
                            return err(m.method.span(), format!("`.{name}([index..], [extent..])` takes two arrays"));
                        }
                        let (Expr::Array(idx), Expr::Array(ext)) = (&m.args[0], &m.args[1]) else {
                            return err(m.args.span(), format!("`.{name}([index..], [extent..])` takes two arrays"));
                        };
                        let idx: Vec<TS> = idx.elems.iter().map(|x| self.val(x)).collect::<syn::Result<_>>()?;
                        let mut ex = vec![];
                        for x in &ext.elems {
                            if self.is_dsl(x) {
                                return err(x.span(), "box extents must be known when the kernel is specialized (mask ragged edges with `.bounded(..)`)");
                            }
                            ex.push(quote!((#x) as i64));
                        }
                        let method = syn::Ident::new(&name, m.method.span());
                        Ok(quote!(__kb.#method(&#id, vec![#(#idx),*], &[#(#ex),*], #lc)))
                    }
                    "bounded" => {
                        let inner = self.region(&m.receiver)?;
                        let Some(Expr::Array(b)) = m.args.first() else {
                            return err(m.method.span(), "`.bounded([end..])` takes one array of bounds");
                        };
                        let b: Vec<TS> = b.elems.iter().map(|x| self.val(x)).collect::<syn::Result<_>>()?;
                        Ok(quote!(__kb.bounded(#inner, vec![#(#b),*], #lc)))
                    }
                    _ => err(
                        m.method.span(),
                        format!("unknown region method `.{name}`; expected `.tile`, `.tile_at` or `.bounded`"),
                    ),
                }
            }
            _ => self.tile_arg(e, "`copy`"),
        }
    }

    fn operand(&self, e: &Expr) -> syn::Result<TS> {
        if let Expr::MethodCall(m) = e {
            if m.method == "t" && m.args.is_empty() {
                let t = self.tile_arg(&m.receiver, "`gemm`")?;
                return Ok(quote!((#t).t()));
            }
            return err(m.method.span(), "a gemm operand is a tile or `tile.t()`");
        }
        self.tile_arg(e, "`gemm`")
    }

    fn primitive(
        &mut self,
        name: &str,
        args: &syn::punctuated::Punctuated<Expr, syn::token::Comma>,
        span: Span,
        lc: TS,
    ) -> syn::Result<TS> {
        let arity = |n: usize| check_arity(name, args.len(), n, span);
        match name {
            "copy" => {
                arity(2)?;
                let (s, d) = (self.region(&args[0])?, self.region(&args[1])?);
                Ok(quote!(__kb.copy(#s, #d, #lc);))
            }
            "gemm" => {
                arity(3)?;
                let (a, b) = (self.operand(&args[0])?, self.operand(&args[1])?);
                let c = self.tile_arg(&args[2], "`gemm`")?;
                Ok(quote!(__kb.gemm(#a, #b, #c, #lc);))
            }
            "clear" => {
                arity(1)?;
                let t = self.tile_arg(&args[0], "`clear`")?;
                Ok(quote!(__kb.fill(#t, 0, #lc);))
            }
            "fill" => {
                arity(2)?;
                let t = self.tile_arg(&args[0], "`fill`")?;
                let v = self.val(&args[1])?;
                Ok(quote!(__kb.fill(#t, #v, #lc);))
            }
            "reduce_sum" | "reduce_max" => {
                arity(3)?;
                let (s, d) = (self.tile_arg(&args[0], name)?, self.tile_arg(&args[1], name)?);
                let ax = &args[2];
                if self.is_dsl(ax) {
                    return err(ax.span(), "the axis must be known when the kernel is specialized");
                }
                let op = if name == "reduce_sum" { quote!(Sum) } else { quote!(Max) };
                Ok(quote!(__kb.reduce(::kda_dsl::tile::ReduceOp::#op, #s, #d, #ax, #lc);))
            }
            "cumsum" => {
                arity(3)?;
                let (s, d) = (self.tile_arg(&args[0], name)?, self.tile_arg(&args[1], name)?);
                let ax = &args[2];
                if self.is_dsl(ax) {
                    return err(ax.span(), "the axis must be known when the kernel is specialized");
                }
                Ok(quote!(__kb.cumsum(#s, #d, #ax, #lc);))
            }
            "print" => {
                arity(1)?;
                let t = self.tile_arg(&args[0], "`print`")?;
                Ok(quote!(__kb.print(#t, #lc);))
            }
            "assume_extent" | "assume_multiple" => {
                arity(2)?;
                let d = match &args[0] {
                    Expr::Path(p)
                        if p.path.segments.len() == 1 && self.dims.contains(&p.path.segments[0].ident.to_string()) =>
                    {
                        &args[0]
                    }
                    other => return err(other.span(), format!("`{name}` takes an extent symbol first")),
                };
                let v = &args[1];
                if self.is_dsl(v) {
                    return err(v.span(), "the value must be known when the kernel is specialized");
                }
                let method = syn::Ident::new(name, span);
                Ok(quote!(__kb.#method(&#d, #v, #lc);))
            }
            "launch" => {
                err(span, "`launch` binds the block indices: `let (bx, by) = launch(grid = [..], threads = n);`")
            }
            "shared" | "fragment" | "local" => err(span, format!("bind the tile to a name: `let x = {name}(..);`")),
            _ if MATH1.contains(&name) || MATH2.contains(&name) || name == "select" => {
                err(span, format!("`{name}(..)` computes a value; bind or store it"))
            }
            _ => {
                if args.iter().any(|a| self.is_dsl(a)) {
                    return err(
                        span,
                        format!("unknown primitive `{name}`; the tile primitives are {}", PRIMITIVES.join(", ")),
                    );
                }
                let f = syn::Ident::new(name, span);
                Ok(quote!(#f(#args);))
            }
        }
    }

    fn assign(&mut self, left: &Expr, right: &Expr, op: Option<&syn::BinOp>, lc: TS) -> syn::Result<TS> {
        let rhs = match op {
            None => self.val(right)?,
            Some(op) => {
                let l = self.val(left)?;
                let r = self.val(right)?;
                let b = match op {
                    syn::BinOp::AddAssign(_) => quote!(Add),
                    syn::BinOp::SubAssign(_) => quote!(Sub),
                    syn::BinOp::MulAssign(_) => quote!(Mul),
                    syn::BinOp::DivAssign(_) => quote!(Div),
                    syn::BinOp::RemAssign(_) => quote!(Rem),
                    o => return err(o.span(), "unsupported compound assignment in a kernel"),
                };
                quote!(::kda_dsl::builder::Val::bin(::kda_dsl::tile::BinOp::#b, #l, #r))
            }
        };
        if let Some((k, id)) = self.ident_kind(left) {
            return match k {
                Kind::Val => Ok(quote!(__kb.assign(&#id, #rhs, #lc);)),
                Kind::Tile => {
                    err(id.span(), format!("`{id}` is a tile; assign its elements (`{id}[i][j] = ..`) or `fill` it"))
                }
                _ => err(id.span(), format!("`{id}` is a global tensor; write it with `copy` or element stores")),
            };
        }
        if let Expr::Index(_) = left {
            let (base, idx) = self.index_chain(left)?;
            let idx: Vec<TS> = idx.iter().map(|x| self.val(x)).collect::<syn::Result<_>>()?;
            return match self.ident_kind(base) {
                Some((Kind::Tile, id)) => Ok(quote!(__kb.store(&#id, vec![#(#idx),*], #rhs, #lc);)),
                Some((Kind::Tensor, id)) => {
                    if self.in_parallel == 0 {
                        return err(id.span(), format!("element stores to the global tensor `{id}` belong inside `parallel`; whole boxes go through `copy`"));
                    }
                    Ok(quote!(__kb.store_global(&#id, vec![#(#idx),*], #rhs, #lc);))
                }
                _ => err(base.span(), "only tiles and global tensors can be indexed"),
            };
        }
        if self.is_dsl(right) {
            return err(left.span(), "a kernel value can only be assigned to a `let` variable of the kernel");
        }
        Ok(quote!(#left = #right;))
    }

    fn index_chain<'e>(&self, e: &'e Expr) -> syn::Result<(&'e Expr, Vec<&'e Expr>)> {
        let mut idx = vec![];
        let mut cur = e;
        while let Expr::Index(i) = cur {
            idx.push(&*i.index);
            cur = &i.expr;
        }
        idx.reverse();
        Ok((cur, idx))
    }

    fn for_loop(&mut self, f: &syn::ExprForLoop) -> syn::Result<TS> {
        let it = &*f.expr;
        let Some((name, args, sp)) = call_name(it)
            .filter(|(n, _, _)| matches!(n.as_str(), "serial" | "unroll" | "pipelined" | "parallel" | "warp_group"))
        else {
            if self.is_dsl(it) {
                return err(it.span(), "a kernel loop runs over `serial(..)`, `unroll(..)`, `pipelined(.., stages = s)`, `parallel(tile)` or `warp_group(first, count)`");
            }
            // A host loop: unrolled while the kernel is specialized.
            self.scopes.push(HashMap::new());
            self.bind_pat_host(&f.pat);
            let body = self.block_stmts(&f.body.stmts);
            self.scopes.pop();
            let body = body?;
            let (pat, expr) = (&f.pat, &f.expr);
            return Ok(quote!(for #pat in #expr { #body }));
        };
        let lc = loc(sp);
        let (pos, kw) = kwargs(args);
        self.scopes.push(HashMap::new());
        let out = (|| -> syn::Result<TS> {
            if name == "warp_group" {
                if pos.len() != 2 || !kw.is_empty() {
                    return err(
                        sp,
                        "`warp_group` takes the first warp and the number of warps: `for w in warp_group(0, 2)`",
                    );
                }
                for a in &pos {
                    if self.is_dsl(a) {
                        return err(a.span(), "warp group bounds must be known when the kernel is specialized");
                    }
                }
                let var = match &*f.pat {
                    Pat::Ident(i) => i.ident.clone(),
                    Pat::Wild(w) => syn::Ident::new("_warp", w.span()),
                    o => return err(o.span(), "name the warp index: `for w in warp_group(..)`"),
                };
                let vs = var.to_string();
                self.bind(&vs, Kind::Val);
                let (first, count) = (pos[0], pos[1]);
                let body = self.block_stmts(&f.body.stmts)?;
                return Ok(quote!({
                    let #var = __kb.begin_warp_group(#vs, #first, #count, #lc);
                    #body
                    __kb.end();
                }));
            }
            if name == "parallel" {
                if pos.len() != 1 || !kw.is_empty() {
                    return err(sp, "`parallel` takes one tile: `for (i, j) in parallel(t)`");
                }
                if self.in_parallel > 0 {
                    return err(sp, "`parallel` loops do not nest");
                }
                let t = self.tile_arg(pos[0], "`parallel`")?;
                let names: Vec<syn::Ident> = match &*f.pat {
                    Pat::Ident(i) => vec![i.ident.clone()],
                    Pat::Tuple(t) => t
                        .elems
                        .iter()
                        .map(|p| match p {
                            Pat::Ident(i) => Ok(i.ident.clone()),
                            o => err(o.span(), "expected an index name"),
                        })
                        .collect::<syn::Result<_>>()?,
                    o => return err(o.span(), "name the indices: `for (i, j) in parallel(t)`"),
                };
                let strs: Vec<String> = names.iter().map(|n| n.to_string()).collect();
                for n in &strs {
                    self.bind(n, Kind::Val);
                }
                self.in_parallel += 1;
                let body = self.block_stmts(&f.body.stmts);
                self.in_parallel -= 1;
                let body = body?;
                let binds: Vec<TS> =
                    names.iter().enumerate().map(|(i, n)| quote!(let #n = __idx[#i].clone();)).collect();
                return Ok(quote!({
                    let __idx = __kb.begin_parallel(#t, &[#(#strs),*], #lc);
                    #(#binds)*
                    #body
                    __kb.end();
                }));
            }
            let var = match &*f.pat {
                Pat::Ident(i) => i.ident.clone(),
                Pat::Wild(w) => syn::Ident::new("_unused", w.span()),
                o => return err(o.span(), "a loop counter is one name"),
            };
            let (start, end) = match pos.len() {
                1 => (quote!(::kda_dsl::builder::Val::from(0)), self.val(pos[0])?),
                2 => (self.val(pos[0])?, self.val(pos[1])?),
                _ => return err(sp, format!("`{name}` takes `(end)` or `(start, end)`")),
            };
            let kind = match name.as_str() {
                "serial" | "unroll" => {
                    if let Some((k, _, ksp)) = kw.first() {
                        return err(*ksp, format!("`{name}` takes no `{k}` argument"));
                    }
                    if name == "serial" {
                        quote!(::kda_dsl::tile::LoopKind::Serial)
                    } else {
                        quote!(::kda_dsl::tile::LoopKind::Unroll)
                    }
                }
                _ => {
                    let mut stages = None;
                    for (k, v, ksp) in &kw {
                        if k != "stages" {
                            return err(*ksp, format!("unknown `pipelined` argument `{k}`; expected `stages`"));
                        }
                        if self.is_dsl(v) {
                            return err(v.span(), "the stage count must be known when the kernel is specialized");
                        }
                        stages = Some(*v);
                    }
                    let Some(s) = stages else { return err(sp, "`pipelined` needs `stages = n`") };
                    quote!(::kda_dsl::tile::LoopKind::Pipelined { stages: (#s) as u32 })
                }
            };
            let vs = var.to_string();
            self.bind(&vs, Kind::Val);
            let body = self.block_stmts(&f.body.stmts)?;
            Ok(quote!({
                let #var = __kb.begin_for(#vs, #kind, #start, #end, #lc);
                #body
                __kb.end();
            }))
        })();
        self.scopes.pop();
        out
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> syn::Result<TS> {
        if !self.is_dsl(&i.cond) {
            // A host branch: resolved while specializing.
            let cond = &i.cond;
            let then = self.block_stmts(&i.then_branch.stmts)?;
            let els = match &i.else_branch {
                None => quote!(),
                Some((_, e)) => {
                    let inner = match &**e {
                        Expr::Block(b) => self.block_stmts(&b.block.stmts)?,
                        Expr::If(ei) => self.if_stmt(ei)?,
                        o => return err(o.span(), "unexpected else branch"),
                    };
                    quote!(else { #inner })
                }
            };
            return Ok(quote!(if #cond { #then } #els));
        }
        let lc = loc(i.if_token.span);
        let c = self.val(&i.cond)?;
        let then = self.block_stmts(&i.then_branch.stmts)?;
        let els = match &i.else_branch {
            None => quote!(),
            Some((_, e)) => {
                let inner = match &**e {
                    Expr::Block(b) => self.block_stmts(&b.block.stmts)?,
                    Expr::If(ei) => self.if_stmt(ei)?,
                    o => return err(o.span(), "unexpected else branch"),
                };
                quote!(__kb.begin_else(); #inner)
            }
        };
        Ok(quote!({ __kb.begin_if(#c, #lc); #then #els __kb.end(); }))
    }

    /// A kernel value expression, as code building a `Val`.
    fn val(&self, e: &Expr) -> syn::Result<TS> {
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

    fn val_call(&self, e: &Expr) -> syn::Result<TS> {
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

/// An error at `span` unless `got` arguments were given to `name`, which takes `want`.
fn check_arity(name: &str, got: usize, want: usize, span: Span) -> syn::Result<()> {
    if got != want {
        return err(span, format!("`{name}` takes {want} argument{}, found {got}", if want == 1 { "" } else { "s" }));
    }
    Ok(())
}

fn block_value(b: &syn::Block) -> syn::Result<&Expr> {
    match b.stmts.as_slice() {
        [Stmt::Expr(e, None)] => Ok(e),
        _ => err(b.span(), "an `if` value branch holds one expression"),
    }
}

fn is_compound(op: &syn::BinOp) -> bool {
    matches!(
        op,
        syn::BinOp::AddAssign(_)
            | syn::BinOp::SubAssign(_)
            | syn::BinOp::MulAssign(_)
            | syn::BinOp::DivAssign(_)
            | syn::BinOp::RemAssign(_)
    )
}
