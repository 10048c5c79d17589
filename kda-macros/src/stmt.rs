//! Statements of a kernel body: `let`s, tile primitives, loops, branches and assignments.

use super::*;

impl Cx {
    pub(crate) fn block_stmts(&mut self, stmts: &[Stmt]) -> syn::Result<TS> {
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
    pub(crate) fn becomes_kernel_var(&self, l: &syn::Local, rest: &[Stmt]) -> bool {
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

    pub(crate) fn kernel_var(&mut self, l: &syn::Local) -> syn::Result<TS> {
        let Pat::Ident(pi) = &l.pat else { return err(l.pat.span(), "a kernel variable is one name") };
        let Some(init) = &l.init else { return err(l.span(), "a kernel `let` needs a value") };
        let v = self.val(&init.expr)?;
        let id = &pi.ident;
        let n = id.to_string();
        let lc = loc(init.expr.span());
        self.bind(&n, Kind::Val);
        Ok(quote!(let #id = __kb.let_var(#n, #v, #lc);))
    }

    pub(crate) fn stmt(&mut self, s: &Stmt) -> syn::Result<TS> {
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

    pub(crate) fn local(&mut self, l: &syn::Local) -> syn::Result<TS> {
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
                    if pos.len() != 2 {
                        return err(fspan, format!("`{name}` takes two arguments: `[extents]` and the element type"));
                    }
                    // `fragment(.., lanes_per_row = n)`: a host value, checked by the builder.
                    let mut lanes = None;
                    for (k, v, kspan) in kw {
                        if lanes.is_some() && k == "lanes_per_row" {
                            return err(kspan, "`lanes_per_row` is given twice");
                        }
                        if name != "fragment" || k != "lanes_per_row" {
                            return err(
                                kspan,
                                format!("`{name}` takes no `{k}` here (fragments take `lanes_per_row = 4 or 32`)"),
                            );
                        }
                        if self.is_dsl(v) {
                            return err(v.span(), "lanes_per_row must be known when the kernel is specialized");
                        }
                        lanes = Some(v);
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
                    if let Some(lanes) = lanes {
                        return Ok(quote!(let #id = __kb.fragment_lanes(#n, &[#(#ext),*], #dt, (#lanes) as i64, #lc);));
                    }
                    return Ok(quote!(let #id = __kb.#method(#n, &[#(#ext),*], #dt, #lc);));
                }
                _ => {}
            }
        }
        if let Expr::Struct(st) = e {
            if self.is_dsl(e) {
                return self.tile_struct(&l.pat, st);
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

    /// `let keys = KeyTiles { k_sh, q: q_sh };`: a host struct of tiles for a helper that takes
    /// it whole (each field a tile of the kernel; no `..base`, which could hide a field).
    pub(crate) fn tile_struct(&mut self, pat: &Pat, st: &syn::ExprStruct) -> syn::Result<TS> {
        let Pat::Ident(pi) = pat else {
            return err(pat.span(), "a struct of tiles binds to one name");
        };
        if let Some(rest) = &st.rest {
            return err(rest.span(), "a struct of tiles names every field; `..base` is not supported in a kernel");
        }
        for f in &st.fields {
            match self.ident_kind(&f.expr) {
                Some((Kind::Tile, _)) => {}
                Some((k, id)) => {
                    return err(id.span(), format!("a struct in a kernel holds tiles; `{id}` is {}", k.noun()));
                }
                None => return err(f.expr.span(), "a struct in a kernel holds tiles, each named by its `let`"),
            }
        }
        self.bind(&pi.ident.to_string(), Kind::Tiles);
        Ok(quote!(let #pi = #st;))
    }

    pub(crate) fn bind_pat_host(&mut self, p: &Pat) {
        match p {
            Pat::Ident(i) => self.bind(&i.ident.to_string(), Kind::Host),
            Pat::Tuple(t) => t.elems.iter().for_each(|e| self.bind_pat_host(e)),
            Pat::Type(t) => self.bind_pat_host(&t.pat),
            _ => {}
        }
    }

    pub(crate) fn launch(
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
        let mut fill_warps = None;
        let mut producer_registers = None;
        let mut hoist = None;
        let mut wgmma_min_n = None;
        let mut cluster = None;
        for (k, v, sp) in kw {
            match k.as_str() {
                "grid" => grid = Some(v),
                "threads" => threads = Some(v),
                "min_blocks" => min_blocks = Some(v),
                "fill_warps" => fill_warps = Some(v),
                "producer_registers" => producer_registers = Some(v),
                "hoist" => hoist = Some(v),
                "wgmma_min_n" => wgmma_min_n = Some(v),
                "cluster" => cluster = Some(v),
                _ => {
                    return err(
                        sp,
                        format!(
                            "unknown `launch` argument `{k}`; expected `grid`, `threads`, `min_blocks`, `fill_warps`, `producer_registers`, `hoist`, `wgmma_min_n` or `cluster`"
                        ),
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
        let min_blocks = self.known_setting(min_blocks, "min_blocks", quote!(min_blocks_per_sm), &lc)?;
        let fill_warps = self.known_setting(fill_warps, "fill_warps", quote!(fill_warps), &lc)?;
        let producer_registers =
            self.known_setting(producer_registers, "producer_registers", quote!(producer_registers), &lc)?;
        let hoist = match hoist {
            Some(h) if self.is_dsl(h) => return err(h.span(), "`hoist` must be known when the kernel is specialized"),
            Some(h) => quote!(__kb.hoist(#h);),
            None => quote!(),
        };
        let wgmma_min_n = self.known_setting(wgmma_min_n, "wgmma_min_n", quote!(wgmma_min_n), &lc)?;
        let cluster = self.known_setting(cluster, "cluster", quote!(cluster_blocks), &lc)?;
        Ok(quote! {
            let __blk = __kb.launch(vec![#(#g),*], #threads, #lc);
            #min_blocks
            #fill_warps
            #producer_registers
            #hoist
            #wgmma_min_n
            #cluster
            #(#binds)*
        })
    }

    /// The builder's call `__kb.method(value, loc)` for a `launch` setting that must be known
    /// when the kernel is specialized (nothing when not given).
    fn known_setting(&self, value: Option<&Expr>, name: &str, method: TS, lc: &TS) -> syn::Result<TS> {
        match value {
            Some(v) if self.is_dsl(v) => {
                err(v.span(), format!("`{name}` must be known when the kernel is specialized"))
            }
            Some(v) => Ok(quote!(__kb.#method(#v, #lc);)),
            None => Ok(quote!()),
        }
    }

    /// A grid term: extents, config values, `+ - * /` and `ceil_div`.
    pub(crate) fn host_expr(&self, e: &Expr) -> syn::Result<TS> {
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

    pub(crate) fn expr_stmt(&mut self, e: &Expr) -> syn::Result<TS> {
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

    /// A call of the `#[kernel_fn]` helper `name`: the builder first, then tiles and tensors (both
    /// `Copy` handles), kernel values as `Val`s and host values as they are.
    pub(crate) fn helper_call(
        &self,
        name: &str,
        args: &syn::punctuated::Punctuated<Expr, syn::token::Comma>,
        span: Span,
    ) -> syn::Result<TS> {
        let f = syn::Ident::new(name, span);
        let args = args
            .iter()
            .map(|a| match self.ident_kind(a) {
                Some((Kind::Tile | Kind::Tensor | Kind::Tiles, id)) => Ok(quote!(#id)),
                _ if self.is_dsl(a) => self.val(a),
                _ => Ok(quote!(#a)),
            })
            .collect::<syn::Result<Vec<TS>>>()?;
        Ok(quote_spanned!(span=> #f(&__kb, #(#args),*)))
    }

    pub(crate) fn tile_arg(&self, e: &Expr, what: &str) -> syn::Result<TS> {
        match self.ident_kind(e) {
            Some((Kind::Tile, id)) => Ok(quote!(&#id)),
            Some((Kind::Tensor, id)) => {
                err(id.span(), format!("`{id}` is a global tensor; {what} needs a tile (shared, fragment or local)"))
            }
            Some((Kind::Tiles, id)) => {
                err(id.span(), format!("`{id}` is a struct of tiles; {what} needs one tile (a field a helper binds)"))
            }
            Some((_, id)) => err(id.span(), format!("`{id}` is a scalar; {what} needs a tile")),
            None => err(e.span(), format!("{what} needs a tile name here")),
        }
    }

    pub(crate) fn region(&self, e: &Expr) -> syn::Result<TS> {
        match e {
            Expr::MethodCall(m) => {
                let name = m.method.to_string();
                let lc = loc(m.method.span());
                match name.as_str() {
                    "tile" | "tile_at" => {
                        let Some((Kind::Tensor, id)) = self.ident_kind(&m.receiver) else {
                            if let Some((k, id)) = self.ident_kind(&m.receiver) {
                                let kind = k.noun();
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
                    "streaming" => {
                        let inner = self.boxed_region(&m.receiver, &name)?;
                        if !m.args.is_empty() {
                            return err(m.args.span(), "`.streaming()` takes no arguments");
                        }
                        Ok(quote!(__kb.streaming(#inner, #lc)))
                    }
                    "whole_lines" => {
                        let inner = self.boxed_region(&m.receiver, &name)?;
                        let on = match m.args.len() {
                            0 => quote!(true),
                            1 if !self.is_dsl(&m.args[0]) => {
                                let a = &m.args[0];
                                quote!((#a))
                            }
                            1 => {
                                return err(
                                    m.args[0].span(),
                                    "`.whole_lines(on)` takes a host `bool`, known when the kernel is specialized",
                                )
                            }
                            _ => return err(m.args.span(), "`.whole_lines()` takes at most one argument"),
                        };
                        Ok(quote!(__kb.whole_lines(#inner, #on, #lc)))
                    }
                    "bounded" => {
                        let inner = self.boxed_region(&m.receiver, &name)?;
                        let Some(Expr::Array(b)) = m.args.first() else {
                            return err(m.method.span(), "`.bounded([end..])` takes one array of bounds");
                        };
                        let b: Vec<TS> = b.elems.iter().map(|x| self.val(x)).collect::<syn::Result<_>>()?;
                        Ok(quote!(__kb.bounded(#inner, vec![#(#b),*], #lc)))
                    }
                    _ => err(
                        m.method.span(),
                        format!(
                            "unknown region method `.{name}`; expected `.tile`, `.tile_at`, `.bounded`, `.streaming` or `.whole_lines`"
                        ),
                    ),
                }
            }
            _ => self.tile_arg(e, "`copy`"),
        }
    }

    /// The box `.{method}(..)` refines: a global box (`t.tile_at(..)` or an already refined one),
    /// never a whole tile.
    fn boxed_region(&self, receiver: &Expr, method: &str) -> syn::Result<TS> {
        if !matches!(receiver, Expr::MethodCall(_)) {
            return err(
                receiver.span(),
                format!("`.{method}(..)` applies to a box of a global tensor (`t.tile_at(..)`), not to a tile"),
            );
        }
        self.region(receiver)
    }

    pub(crate) fn operand(&self, e: &Expr) -> syn::Result<TS> {
        if let Expr::MethodCall(m) = e {
            if m.method == "t" && m.args.is_empty() {
                let t = self.tile_arg(&m.receiver, "`gemm`")?;
                return Ok(quote!((#t).t()));
            }
            if m.method == "replicated" && m.args.is_empty() {
                let t = self.tile_arg(&m.receiver, "`gemm`")?;
                return Ok(quote!((#t).replicated()));
            }
            return err(m.method.span(), "a gemm operand is a tile, `tile.t()` or `tile.replicated()`");
        }
        self.tile_arg(e, "`gemm`")
    }

    pub(crate) fn primitive(
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
            "prefetch" => {
                arity(1)?;
                let r = self.region(&args[0])?;
                Ok(quote!(__kb.prefetch(#r, #lc);))
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
                    // A `#[kernel_fn]` helper (rustc says so at the name when there is none).
                    let call = self.helper_call(name, args, span)?;
                    return Ok(quote!(#call;));
                }
                let f = syn::Ident::new(name, span);
                Ok(quote!(#f(#args);))
            }
        }
    }

    pub(crate) fn assign(&mut self, left: &Expr, right: &Expr, op: Option<&syn::BinOp>, lc: TS) -> syn::Result<TS> {
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
                Kind::Tensor => {
                    err(id.span(), format!("`{id}` is a global tensor; write it with `copy` or element stores"))
                }
                k => err(id.span(), format!("`{id}` is {}; it cannot be assigned in a kernel", k.noun())),
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

    pub(crate) fn index_chain<'e>(&self, e: &'e Expr) -> syn::Result<(&'e Expr, Vec<&'e Expr>)> {
        let mut idx = vec![];
        let mut cur = e;
        while let Expr::Index(i) = cur {
            idx.push(&*i.index);
            cur = &i.expr;
        }
        idx.reverse();
        Ok((cur, idx))
    }

    pub(crate) fn for_loop(&mut self, f: &syn::ExprForLoop) -> syn::Result<TS> {
        let it = &*f.expr;
        let Some((name, args, sp)) = call_name(it).filter(|(n, _, _)| {
            matches!(n.as_str(), "serial" | "unroll" | "pipelined" | "parallel" | "warp_group" | "producer")
        }) else {
            if self.is_dsl(it) {
                return err(it.span(), "a kernel loop runs over `serial(..)`, `unroll(..)`, `pipelined(.., stages = s)`, `parallel(tile)`, `warp_group(first, count)` or `producer()`");
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
            if name == "producer" {
                if !pos.is_empty() || !kw.is_empty() {
                    return err(sp, "`producer` takes no arguments: `for _ in producer() { .. }`");
                }
                if !matches!(&*f.pat, Pat::Wild(_)) {
                    return err(f.pat.span(), "a producer block binds nothing: `for _ in producer() { .. }`");
                }
                if self.in_parallel > 0 {
                    return err(sp, "a producer block stands in a `pipelined` loop's body, not inside `parallel`");
                }
                let body = self.block_stmts(&f.body.stmts)?;
                return Ok(quote!({
                    __kb.begin_producer(#lc);
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
                    let (mut stages, mut in_flight) = (None, None);
                    for (k, v, ksp) in &kw {
                        let slot = match k.as_str() {
                            "stages" => &mut stages,
                            "fills_in_flight" => &mut in_flight,
                            _ => {
                                return err(
                                    *ksp,
                                    format!(
                                        "unknown `pipelined` argument `{k}`; expected `stages` or `fills_in_flight`"
                                    ),
                                )
                            }
                        };
                        if self.is_dsl(v) {
                            return err(v.span(), format!("`{k}` must be known when the kernel is specialized"));
                        }
                        *slot = Some(*v);
                    }
                    let Some(s) = stages else { return err(sp, "`pipelined` needs `stages = n`") };
                    let barriers = match in_flight {
                        Some(b) => quote!(if #b {
                            ::kda_dsl::tile::BodyBarriers::LeaveFillsInFlight
                        } else {
                            ::kda_dsl::tile::BodyBarriers::WaitForFills
                        }),
                        None => quote!(::kda_dsl::tile::BodyBarriers::WaitForFills),
                    };
                    quote!(::kda_dsl::tile::LoopKind::Pipelined { stages: (#s) as u32, barriers: #barriers })
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

    pub(crate) fn if_stmt(&mut self, i: &syn::ExprIf) -> syn::Result<TS> {
        if !self.is_dsl(&i.cond) {
            // A host branch: resolved while specializing.
            let cond = &i.cond;
            let then = self.block_stmts(&i.then_branch.stmts)?;
            let els = match &i.else_branch {
                None => quote!(),
                Some((_, e)) => {
                    let inner = self.else_body(e)?;
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
                let inner = self.else_body(e)?;
                quote!(__kb.begin_else(); #inner)
            }
        };
        Ok(quote!({ __kb.begin_if(#c, #lc); #then #els __kb.end(); }))
    }

    /// The statements of an `else` (a block, or an `else if` chain).
    fn else_body(&mut self, e: &Expr) -> syn::Result<TS> {
        match e {
            Expr::Block(b) => self.block_stmts(&b.block.stmts),
            Expr::If(ei) => self.if_stmt(ei),
            o => err(o.span(), "unexpected else branch"),
        }
    }
}
