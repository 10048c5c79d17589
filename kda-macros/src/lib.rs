//! The `#[kernel]` front end of the kda tile DSL.
//!
//! A kernel is a Rust function whose first parameter is its config (`cfg: &Config`), followed
//! by global tensors (`a: Global<(M, K), {cfg.dtype}>`, `c: GlobalMut<..>`) and scalars
//! (`scale: f32`). The attribute turns it into `fn name(cfg: &Config) -> Result<KernelDef, Diag>`
//! that records the kernel with `kda_dsl::builder`. Expressions that use no kernel value are
//! ordinary Rust evaluated when the kernel is specialized (so config loops unroll and config
//! branches vanish); the rest become kernel IR. Every mistake the front end can see is a
//! compile error at the user's token. `#[kernel_fn]` marks a helper written the same way, a
//! named step a kernel calls and the macro inlines.

#![warn(missing_docs)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TS};
use quote::{quote, quote_spanned};
use std::collections::HashMap;
use syn::spanned::Spanned;
use syn::{parse_macro_input, Expr, FnArg, GenericArgument, ItemFn, Pat, PathArguments, Stmt, Type};

mod expr;
#[cfg(test)]
mod fuzz_tests;
mod stmt;

/// Marks a function as a tile kernel. See the crate docs for the accepted forms.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    attribute("#[kernel]", attr, item, expand)
}

/// Marks a function as a kernel helper: a named step of kernel bodies, inlined where a kernel
/// (or another helper) calls it as a statement, `step(a, b, x)`, or as a value when it returns
/// `Val`. Parameters typed `Tile`, `Tensor` and `Val` take the caller's tiles, global tensors
/// and kernel values (a `Val` also takes a host number); any other type is a host value (a
/// config, a count), as in a kernel. A parameter written as a struct pattern,
/// `KeyTiles { k_sh, q_sh, .. }: KeyTiles`, takes a struct of tiles (a `Copy` Rust struct whose
/// fields are `kda_dsl::builder::Tile`s, built in the caller as `let keys = KeyTiles { k_sh,
/// q_sh };`) and binds each named field as a tile, so a step of many tiles takes them as one
/// argument. A call passes at least one tile, tensor, struct of tiles or kernel value: a call
/// of host values alone is host Rust.
/// Its body is written as a kernel body (no `launch`, and no element stores to global tensors:
/// those belong to the `parallel` of the caller).
#[proc_macro_attribute]
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    attribute("#[kernel_fn]", attr, item, expand_fn)
}

/// An attribute that takes no arguments and expands the function it marks with `expand`.
fn attribute(name: &str, attr: TokenStream, item: TokenStream, expand: fn(ItemFn) -> syn::Result<TS>) -> TokenStream {
    if !attr.is_empty() {
        let a: TS = attr.into();
        return syn::Error::new(a.span(), format!("{name} takes no arguments")).to_compile_error().into();
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
    /// A host struct whose fields are tiles (`let keys = KeyTiles { k_sh, q_sh };`), passed
    /// whole to a helper that destructures it.
    Tiles,
    Val,
    Host,
}

impl Kind {
    /// What a name of this kind is, for errors: "`x` is a tile".
    fn noun(self) -> &'static str {
        match self {
            Kind::Tensor => "a global tensor",
            Kind::Tile => "a tile",
            Kind::Tiles => "a struct of tiles",
            Kind::Val => "a scalar",
            Kind::Host => "a host value",
        }
    }
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
    "prefetch",
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
/// Math functions people reach for that the DSL lacks: a call of one is an error listing those
/// it has, not a `#[kernel_fn]` helper call.
const UNSUPPORTED_MATH: &[&str] = &[
    "tanh", "sin", "cos", "tan", "pow", "powf", "powi", "ln", "log2", "log10", "exp10", "floor", "ceil", "round", "erf",
];

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

/// `#[kernel_fn]`: the helper becomes `fn name(__kb: &KernelBuilder, params..) [-> Val]` whose
/// body records into the caller's kernel.
fn expand_fn(f: ItemFn) -> syn::Result<TS> {
    let (name, vis, attrs) = (&f.sig.ident, &f.vis, &f.attrs);
    if !f.sig.generics.params.is_empty() {
        return err(f.sig.generics.span(), "a kernel helper takes no generic parameters");
    }
    let returns_val = match &f.sig.output {
        syn::ReturnType::Default => false,
        syn::ReturnType::Type(_, t) if matches!(&**t, Type::Path(p) if p.path.is_ident("Val")) => true,
        syn::ReturnType::Type(_, t) => return err(t.span(), "a kernel helper returns nothing or a `Val`"),
    };
    let mut cx = Cx { scopes: vec![HashMap::new()], dims: vec![], in_parallel: 0 };
    let mut params = vec![];
    let mut vals = vec![];
    for a in &f.sig.inputs {
        let FnArg::Typed(pt) = a else { return err(a.span(), "a kernel helper is a free function") };
        if let Pat::Struct(ps) = &*pt.pat {
            for field in tile_fields(ps)? {
                cx.bind(&field.to_string(), Kind::Tile);
            }
            let ty = &pt.ty;
            params.push(quote!(#ps: #ty));
            continue;
        }
        let Pat::Ident(pi) = &*pt.pat else {
            return err(pt.pat.span(), "expected a parameter name, or a struct pattern naming tiles");
        };
        let ident = &pi.ident;
        let kind = match &*pt.ty {
            Type::Path(p) if p.path.is_ident("Tile") => Some((Kind::Tile, quote!(::kda_dsl::builder::Tile))),
            Type::Path(p) if p.path.is_ident("Tensor") => Some((Kind::Tensor, quote!(::kda_dsl::builder::Tensor))),
            // Kernel values, or host numbers the caller passes as they are.
            Type::Path(p) if p.path.is_ident("Val") => {
                Some((Kind::Val, quote!(impl ::core::convert::Into<::kda_dsl::builder::Val>)))
            }
            _ => None,
        };
        match kind {
            Some((k, ty)) => {
                cx.bind(&ident.to_string(), k);
                params.push(quote!(#ident: #ty));
                if k == Kind::Val {
                    vals.push(quote!(let #ident: ::kda_dsl::builder::Val = #ident.into();));
                }
            }
            None => {
                let ty = &pt.ty;
                params.push(quote!(#pi: #ty));
            }
        }
    }
    let stmts = &f.block.stmts;
    let (body, ret) = match (returns_val, stmts.split_last()) {
        (true, Some((Stmt::Expr(tail, None), head))) => {
            let body = cx.block_stmts(head)?;
            // The tail is read in the helper's scope, where its parameters are bound.
            (body, Some(cx.val(tail)?))
        }
        (true, _) => return err(f.block.span(), "a kernel helper returning `Val` ends with the value's expression"),
        (false, _) => (cx.block_stmts(stmts)?, None),
    };
    let (out, tail) = match ret {
        Some(v) => (quote!(-> ::kda_dsl::builder::Val), quote!(#v)),
        None => (quote!(), quote!()),
    };
    Ok(quote! {
        #(#attrs)*
        #[allow(non_snake_case, unused_variables, unused_mut, unused_braces, clippy::all)]
        #vis fn #name(__kb: &::kda_dsl::builder::KernelBuilder, #(#params),*) #out {
            #[allow(unused_imports)]
            use ::kda_dsl::dtype::DType::{BF16, F16, F32, I32, I64};
            #(#vals)*
            #body
            #tail
        }
    })
}

/// The names a struct-pattern parameter binds (`KeyTiles { k_sh, q: q_sh, .. }`: `k_sh` and
/// `q_sh`), each a tile; a nested or literal field pattern is an error at that field.
fn tile_fields(ps: &syn::PatStruct) -> syn::Result<Vec<syn::Ident>> {
    ps.fields
        .iter()
        .map(|f| match &*f.pat {
            Pat::Ident(pi) if pi.subpat.is_none() && pi.by_ref.is_none() => Ok(pi.ident.clone()),
            other => {
                err(other.span(), "a struct of tiles binds each field to a name: `KeyTiles { k_sh, q: q_sh, .. }`")
            }
        })
        .collect()
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
