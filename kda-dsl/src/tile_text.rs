//! The tile IR's text form read back: [`parse_kernel`] turns what `KernelDef`'s `Display`
//! prints into the same kernel (source locations aside, which the text does not carry), so
//! filetests can start from text and `parse(print(ir)) == ir` holds for every kernel.

use crate::artifact::HostExpr;
use crate::cache_policy::CachePolicy;
use crate::diag::SrcLoc;
use crate::dtype::DType;
use crate::tile::*;

/// One token of the text form.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// A name (identifiers, keywords, operator names).
    Ident(String),
    /// A number as written, and the letters right after it (a dtype suffix, or `x16` in box
    /// shapes).
    Num(String, String),
    /// Punctuation.
    Punct(&'static str),
}

const PUNCTS: [&str; 19] =
    ["->", "..", "+=", "==", "(", ")", "[", "]", "{", "}", ",", ":", ";", "#", "=", "<", ">", ".", "%"];

/// The tokens of `text`, each with its line (1-based).
fn tokenize(text: &str) -> Result<Vec<(Tok, u32)>, String> {
    let b = text.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    let mut line = 1;
    while i < b.len() {
        let c = b[i] as char;
        if c.is_whitespace() {
            line += u32::from(c == '\n');
            i += 1;
        } else if c == '/' && b.get(i + 1) == Some(&b'/') {
            // A comment (the dumps' header lines).
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c.is_ascii_digit() || (c == '-' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let start = i;
            i += 1;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'e' || b[i] == b'E') {
                // An exponent may carry a sign.
                if (b[i] == b'e' || b[i] == b'E') && matches!(b.get(i + 1), Some(b'-') | Some(b'+')) {
                    i += 1;
                }
                i += 1;
            }
            if b.get(i) == Some(&b'.') && b.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
                i += 1;
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'e' || b[i] == b'E' || b[i] == b'-') {
                    i += 1;
                }
            }
            let num = text[start..i].to_string();
            let s2 = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((Tok::Num(num, text[s2..i].to_string()), line));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((Tok::Ident(text[start..i].to_string()), line));
        } else if let Some(p) = PUNCTS.iter().find(|p| text[i..].starts_with(**p)) {
            out.push((Tok::Punct(p), line));
            i += p.len();
        } else if c == '+' || c == '*' || c == '/' {
            let p = match c {
                '+' => "+",
                '*' => "*",
                _ => "/",
            };
            out.push((Tok::Punct(p), line));
            i += 1;
        } else {
            return Err(format!("line {line}: unexpected character `{c}`"));
        }
    }
    Ok(out)
}

fn dtype_named(s: &str) -> Option<DType> {
    [DType::F16, DType::BF16, DType::F32, DType::I32, DType::I64, DType::Bool].into_iter().find(|d| d.name() == s)
}

fn unop_named(s: &str) -> Option<UnOp> {
    use UnOp::*;
    [Neg, Not, Abs, Exp, Exp2, Log, Sigmoid, Softplus, Rsqrt, Sqrt]
        .into_iter()
        .find(|o| format!("{o:?}").to_lowercase() == s)
}

fn binop_named(s: &str) -> Option<BinOp> {
    use BinOp::*;
    [Add, Sub, Mul, Div, Rem, Min, Max, Lt, Le, Gt, Ge, Eq, Ne, And, Or].into_iter().find(|o| format!("{o:?}") == s)
}

fn reduce_named(s: &str) -> Option<ReduceOp> {
    [ReduceOp::Sum, ReduceOp::Max].into_iter().find(|o| format!("{o:?}") == s)
}

struct Parser {
    toks: Vec<Tok>,
    /// Per token, its line.
    lines: Vec<u32>,
    at: usize,
    /// The token looked at last: where an error is.
    last: std::cell::Cell<usize>,
    def: KernelDef,
}

type R<T> = Result<T, String>;

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.last.set(self.at);
        self.toks.get(self.at)
    }

    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.at + k)
    }

    fn next(&mut self) -> R<Tok> {
        self.last.set(self.at);
        let t = self.toks.get(self.at).cloned().ok_or("unexpected end of text")?;
        self.at += 1;
        Ok(t)
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Some(Tok::Punct(q)) if *q == p)
    }

    fn is_ident(&self, s: &str) -> bool {
        matches!(self.peek(), Some(Tok::Ident(q)) if q == s)
    }

    fn punct(&mut self, p: &str) -> R<()> {
        match self.next()? {
            Tok::Punct(q) if q == p => Ok(()),
            t => Err(format!("expected `{p}`, found {t:?}")),
        }
    }

    fn ident(&mut self) -> R<String> {
        match self.next()? {
            Tok::Ident(s) => Ok(s),
            t => Err(format!("expected a name, found {t:?}")),
        }
    }

    fn keyword(&mut self, k: &str) -> R<()> {
        match self.ident()? {
            s if s == k => Ok(()),
            s => Err(format!("expected `{k}`, found `{s}`")),
        }
    }

    fn uint(&mut self) -> R<u64> {
        match self.next()? {
            Tok::Num(n, s) if s.is_empty() => n.parse().map_err(|_| format!("`{n}` is not a count")),
            t => Err(format!("expected a number, found {t:?}")),
        }
    }

    /// `name=value` (a number).
    fn setting(&mut self, name: &str) -> R<u64> {
        self.keyword(name)?;
        self.punct("=")?;
        self.uint()
    }

    fn param_named(&self, n: &str) -> Option<ParamId> {
        self.def.params.position(|p| p.name() == n)
    }

    fn buffer_named(&self, n: &str) -> Option<BufId> {
        self.def.buffers.position(|b| b.name == n)
    }

    /// `name#id`, checked against the variable table.
    fn var(&mut self) -> R<VarId> {
        let name = self.ident()?;
        self.punct("#")?;
        let raw = self.uint()?;
        let found = usize::try_from(raw).ok().filter(|i| *i < self.def.vars.len()).map(VarId::new);
        match found.map(|id| (id, &self.def.vars[id])) {
            Some((id, v)) if v.name == name => Ok(id),
            _ => Err(format!("variable `{name}#{raw}` is not in the table")),
        }
    }

    fn host(&mut self) -> R<HostExpr> {
        match self.next()? {
            Tok::Num(n, s) if s.is_empty() => n.parse().map(HostExpr::Const).map_err(|_| format!("bad constant `{n}`")),
            Tok::Ident(f) if f == "ceil_div" => {
                self.punct("(")?;
                let a = self.host()?;
                self.punct(",")?;
                let b = self.host()?;
                self.punct(")")?;
                Ok(HostExpr::CeilDiv(Box::new(a), Box::new(b)))
            }
            Tok::Ident(d) => Ok(HostExpr::Dim(d)),
            Tok::Punct("(") => {
                let a = self.host()?;
                let op = self.next()?;
                let b = self.host()?;
                self.punct(")")?;
                let (a, b) = (Box::new(a), Box::new(b));
                match op {
                    Tok::Punct("+") => Ok(HostExpr::Add(a, b)),
                    Tok::Punct("*") => Ok(HostExpr::Mul(a, b)),
                    Tok::Punct("/") => Ok(HostExpr::Div(a, b)),
                    t => Err(format!("unknown grid operator {t:?}")),
                }
            }
            t => Err(format!("bad grid expression at {t:?}")),
        }
    }

    fn exprs_until(&mut self, end: &str) -> R<Vec<Expr>> {
        let mut out = vec![];
        while !self.is_punct(end) {
            out.push(self.expr()?);
            if self.is_punct(",") {
                self.punct(",")?;
            }
        }
        self.punct(end)?;
        Ok(out)
    }

    fn expr(&mut self) -> R<Expr> {
        match self.next()? {
            Tok::Num(n, suffix) => {
                let float = n.contains('.') || n.contains('e') || n.contains('E');
                if float && suffix.is_empty() {
                    return n.parse().map(Expr::Float).map_err(|_| format!("bad float `{n}`"));
                }
                let v = n.parse().map_err(|_| format!("bad integer `{n}`"))?;
                match suffix.as_str() {
                    "" => Ok(Expr::Int(v, None)),
                    s => Ok(Expr::Int(v, Some(dtype_named(s).ok_or(format!("bad suffix `{s}`"))?))),
                }
            }
            Tok::Punct("(") => {
                let a = self.expr()?;
                let op = self.ident()?;
                let op = binop_named(&op).ok_or(format!("unknown operator `{op}`"))?;
                let b = self.expr()?;
                self.punct(")")?;
                Ok(Expr::Binary(op, Box::new(a), Box::new(b)))
            }
            Tok::Ident(name) => {
                if self.is_punct("#") {
                    self.at -= 1;
                    return Ok(Expr::Var(self.var()?));
                }
                if self.is_punct("(") {
                    self.punct("(")?;
                    if name == "select" {
                        let c = self.expr()?;
                        self.punct(",")?;
                        let a = self.expr()?;
                        self.punct(",")?;
                        let b = self.expr()?;
                        self.punct(")")?;
                        return Ok(Expr::Select(Box::new(c), Box::new(a), Box::new(b)));
                    }
                    let arg = self.expr()?;
                    self.punct(")")?;
                    if let Some(d) = dtype_named(&name) {
                        return Ok(Expr::Cast(d, Box::new(arg)));
                    }
                    let op = unop_named(&name).ok_or(format!("unknown function `{name}`"))?;
                    return Ok(Expr::Unary(op, Box::new(arg)));
                }
                if self.is_punct("[") {
                    self.punct("[")?;
                    let idx = self.exprs_until("]")?;
                    if let Some(b) = self.buffer_named(&name) {
                        return Ok(Expr::Elem(b, idx));
                    }
                    let p = self.param_named(&name).ok_or(format!("`{name}` is neither a tile nor a tensor"))?;
                    return Ok(Expr::Load(p, idx));
                }
                match name.as_str() {
                    "true" => return Ok(Expr::Bool(true)),
                    "false" => return Ok(Expr::Bool(false)),
                    "inf" => return Ok(Expr::Float(f64::INFINITY)),
                    "NaN" => return Ok(Expr::Float(f64::NAN)),
                    _ => {}
                }
                let p = self.param_named(&name).ok_or(format!("unknown name `{name}`"))?;
                match &self.def.params[p] {
                    Param::Dim { .. } => Ok(Expr::Dim(p)),
                    Param::Scalar { .. } => Ok(Expr::Scalar(p)),
                    Param::Tensor { .. } => Err(format!("tensor `{name}` used as a value")),
                }
            }
            t => Err(format!("bad expression at {t:?}")),
        }
    }

    fn region(&mut self) -> R<Region> {
        let name = self.ident()?;
        if !self.is_punct("[") {
            return self.buffer_named(&name).map(Region::Buf).ok_or(format!("unknown tile `{name}`"));
        }
        let tensor = self.param_named(&name).ok_or(format!("unknown tensor `{name}`"))?;
        self.punct("[")?;
        let offset = self.exprs_until(";")?;
        let shape = match self.next()? {
            Tok::Num(first, rest) => {
                let mut dims = vec![first.parse().map_err(|_| format!("bad extent `{first}`"))?];
                for d in rest.split('x').skip(1) {
                    dims.push(d.parse().map_err(|_| format!("bad extent `{d}`"))?);
                }
                dims
            }
            t => return Err(format!("expected a box shape, found {t:?}")),
        };
        self.punct("]")?;
        let mut bound = None;
        if self.is_ident("bound") {
            self.keyword("bound")?;
            self.punct("[")?;
            bound = Some(self.exprs_until("]")?);
        }
        let mut cache = CachePolicy::Normal;
        if self.is_ident("streaming") {
            self.keyword("streaming")?;
            cache = CachePolicy::EvictFirst;
        }
        let mut whole_lines = false;
        if self.is_ident("whole_lines") {
            self.keyword("whole_lines")?;
            whole_lines = true;
        }
        Ok(Region::Global { tensor, offset, shape, bound, cache, whole_lines })
    }

    fn tile(&mut self) -> R<BufId> {
        let name = self.ident()?;
        self.buffer_named(&name).ok_or(format!("unknown tile `{name}`"))
    }

    fn operand(&mut self) -> R<Operand> {
        let buf = self.tile()?;
        let (mut transposed, mut replicated) = (false, false);
        while self.is_punct(".") {
            self.punct(".")?;
            match self.ident()?.as_str() {
                "T" => transposed = true,
                "replicated" => replicated = true,
                s => return Err(format!("unknown operand modifier `{s}`")),
            }
        }
        Ok(Operand { buf, transposed, replicated })
    }

    fn block(&mut self) -> R<Vec<Stmt>> {
        let mut body = vec![];
        while !self.is_punct("}") {
            body.push(Stmt { kind: self.stmt()?, loc: SrcLoc::default() });
        }
        self.punct("}")?;
        Ok(body)
    }

    fn stmt(&mut self) -> R<StmtKind> {
        let Some(Tok::Ident(word)) = self.peek().cloned() else {
            return Err(format!("expected a statement, found {:?}", self.peek()));
        };
        if self.peek_at(1) == Some(&Tok::Punct("#")) && word != "warp_group" {
            let v = self.var()?;
            self.punct("=")?;
            return Ok(StmtKind::Assign(v, self.expr()?));
        }
        self.at += 1;
        if let Some(op) = word.strip_prefix("reduce_vector_lanes_").and_then(reduce_named) {
            let dst = self.tile()?;
            self.keyword("over")?;
            return Ok(StmtKind::ReduceVectorLanes { op, dst, vector: self.tile()? });
        }
        if let Some(op) = word.strip_prefix("reduce_lanes_").and_then(reduce_named) {
            let dst = self.tile()?;
            return Ok(StmtKind::ReduceLanes { op, dst, axis: self.setting("axis")? as usize });
        }
        if let Some(op) = word.strip_prefix("reduce_").and_then(reduce_named) {
            let src = self.tile()?;
            self.punct("->")?;
            let dst = self.tile()?;
            return Ok(StmtKind::Reduce { op, src, dst, axis: self.setting("axis")? as usize });
        }
        Ok(match word.as_str() {
            "copy" => {
                let src = self.region()?;
                self.punct("->")?;
                StmtKind::Copy { src, dst: self.region()? }
            }
            "gemm" => {
                let a = self.operand()?;
                self.keyword("x")?;
                let b = self.operand()?;
                self.punct("+=")?;
                StmtKind::Gemm { a, b, c: self.tile()? }
            }
            "fill" => {
                let b = self.tile()?;
                self.punct("=")?;
                StmtKind::Fill(b, self.expr()?)
            }
            "parallel" => {
                self.punct("(")?;
                let mut vars = vec![self.var()?];
                while self.is_punct(",") {
                    self.punct(",")?;
                    vars.push(self.var()?);
                }
                self.punct(")")?;
                self.keyword("over")?;
                let over = self.tile()?;
                self.punct("{")?;
                StmtKind::Parallel { over, vars, body: self.block()? }
            }
            "for" => {
                let var = self.var()?;
                self.keyword("in")?;
                let kind = match self.ident()?.as_str() {
                    "serial" => LoopKind::Serial,
                    "unroll" => LoopKind::Unroll,
                    "pipelined" => {
                        self.punct("(")?;
                        let stages = self.setting("stages")? as u32;
                        let mut barriers = BodyBarriers::WaitForFills;
                        if self.is_punct(",") {
                            self.punct(",")?;
                            self.keyword("fills_in_flight")?;
                            barriers = BodyBarriers::LeaveFillsInFlight;
                        }
                        self.punct(")")?;
                        LoopKind::Pipelined { stages, barriers }
                    }
                    k => return Err(format!("unknown loop kind `{k}`")),
                };
                let start = self.expr()?;
                self.punct("..")?;
                let end = self.expr()?;
                self.punct("{")?;
                StmtKind::For { var, kind, start, end, body: self.block()? }
            }
            "if" => {
                let c = self.expr()?;
                self.punct("{")?;
                let mut then = vec![];
                while !self.is_punct("}") {
                    then.push(Stmt { kind: self.stmt()?, loc: SrcLoc::default() });
                }
                self.punct("}")?;
                let mut otherwise = vec![];
                if self.is_ident("else") {
                    self.keyword("else")?;
                    self.punct("{")?;
                    otherwise = self.block()?;
                }
                StmtKind::If(c, then, otherwise)
            }
            "cumsum" => {
                let src = self.tile()?;
                self.punct("->")?;
                let dst = self.tile()?;
                StmtKind::Cumsum { src, dst, axis: self.setting("axis")? as usize }
            }
            "print" => StmtKind::Print(self.tile()?),
            "prefetch" => StmtKind::Prefetch(self.region()?),
            "barrier" => StmtKind::Barrier,
            "producer" => {
                self.punct("{")?;
                StmtKind::Producer(self.block()?)
            }
            "warp_group" => {
                self.punct("#")?;
                let id = self.uint()? as u32;
                self.keyword("warps")?;
                let first = self.uint()? as u32;
                self.punct("..")?;
                let end = self.uint()? as u32;
                self.punct("(")?;
                let var = self.var()?;
                self.punct(")")?;
                self.punct("{")?;
                StmtKind::WarpGroup { first, count: end - first, id, var, body: self.block()? }
            }
            name => {
                self.punct("[")?;
                let idx = self.exprs_until("]")?;
                self.punct("=")?;
                let e = self.expr()?;
                match (self.buffer_named(name), self.param_named(name)) {
                    (Some(b), _) => StmtKind::Store(b, idx, e),
                    (None, Some(p)) => StmtKind::StoreGlobal(p, idx, e),
                    _ => return Err(format!("unknown statement or name `{name}`")),
                }
            }
        })
    }

    fn kernel(&mut self) -> R<()> {
        self.keyword("kernel")?;
        self.def.name = self.ident()?;
        self.punct("(")?;
        // Parameters first by name and kind; tensors' extents resolve once all are known.
        let mut pending: Vec<(ParamId, Vec<String>)> = vec![];
        while !self.is_punct(")") {
            let name = self.ident()?;
            self.punct(":")?;
            let writes = self.is_ident("mut");
            if writes {
                self.keyword("mut")?;
            }
            let kind = self.ident()?;
            if kind == "dim" {
                self.def.params.push(Param::Dim { name });
            } else {
                let dtype = dtype_named(&kind).ok_or(format!("unknown type `{kind}`"))?;
                if self.is_punct("[") {
                    self.punct("[")?;
                    let mut dims = vec![];
                    while !self.is_punct("]") {
                        dims.push(self.ident()?);
                        if self.is_punct(",") {
                            self.punct(",")?;
                        }
                    }
                    self.punct("]")?;
                    let id = self.def.params.push(Param::Tensor { name: name.clone(), dtype, dims: vec![], writes });
                    pending.push((id, dims));
                } else {
                    self.def.params.push(Param::Scalar { name, dtype });
                }
            }
            if self.is_punct(",") {
                self.punct(",")?;
            }
        }
        self.punct(")")?;
        for (id, dims) in pending {
            let resolved: Vec<ParamId> =
                dims.iter().map(|d| self.param_named(d).ok_or(format!("unknown extent `{d}`"))).collect::<R<_>>()?;
            if let Param::Tensor { dims, .. } = &mut self.def.params[id] {
                *dims = resolved;
            }
        }
        self.def.threads = self.setting("threads")? as u32;
        if self.is_ident("min_blocks") {
            self.def.min_blocks_per_sm = Some(self.setting("min_blocks")? as u32);
        }
        if self.is_ident("fill_warps") {
            self.def.fill_warps = self.setting("fill_warps")? as u32;
        }
        if self.is_ident("producer_registers") {
            self.def.producer_registers = Some(self.setting("producer_registers")? as u32);
        }
        if self.is_ident("hoist") {
            self.keyword("hoist")?;
            self.punct("=")?;
            let name = self.ident()?;
            self.def.hoist = Hoist::named(&name)
                .ok_or(format!("hoist = {name}: expected `nothing`, `block_uniform` or `everything`"))?;
        }
        if self.is_ident("wgmma_min_n") {
            self.def.wgmma_min_n = self.setting("wgmma_min_n")? as u32;
        }
        if self.is_ident("cluster") {
            self.def.cluster_blocks = self.setting("cluster")? as u32;
        }
        self.keyword("grid")?;
        self.punct("=")?;
        self.punct("[")?;
        let mut grid = vec![];
        for k in 0..3 {
            grid.push(self.host()?);
            if k < 2 {
                self.punct(",")?;
            }
        }
        self.punct("]")?;
        self.def.grid = [grid[0].clone(), grid[1].clone(), grid[2].clone()];
        self.punct("{")?;
        if self.is_ident("vars") {
            self.keyword("vars")?;
            loop {
                let name = self.ident()?;
                self.punct("#")?;
                let id = self.uint()? as usize;
                self.punct(":")?;
                let t = self.ident()?;
                let dtype = dtype_named(&t).ok_or(format!("unknown type `{t}`"))?;
                if self.def.vars.push(Var { name, dtype }).index() != id {
                    return Err(format!("variable {id} out of order"));
                }
                if !self.is_punct(",") {
                    break;
                }
                self.punct(",")?;
            }
        }
        if self.is_ident("block_vars") {
            self.keyword("block_vars")?;
            self.punct("[")?;
            for k in 0..3 {
                if self.is_ident("_") {
                    self.keyword("_")?;
                } else {
                    self.def.block_vars[k] = Some(self.var()?);
                }
                if k < 2 {
                    self.punct(",")?;
                }
            }
            self.punct("]")?;
        }
        while self.is_ident("assume") {
            self.keyword("assume")?;
            let d = self.ident()?;
            let p = self.param_named(&d).ok_or(format!("unknown extent `{d}`"))?;
            if self.is_punct("%") {
                self.punct("%")?;
                let m = self.uint()? as u32;
                self.punct("==")?;
                self.uint()?;
                self.def.assumptions.push((p, m));
            } else {
                self.punct("==")?;
                let v = match self.next()? {
                    Tok::Num(n, _) => n.parse().map_err(|_| format!("bad extent `{n}`"))?,
                    t => return Err(format!("expected a value, found {t:?}")),
                };
                self.def.exact_extents.push((p, v));
            }
        }
        // Tiles: `name = Scope<dtype>[extents] [lanes_per_row=n]`.
        while matches!(self.peek_at(1), Some(Tok::Punct("="))) && matches!(self.peek_at(2), Some(Tok::Ident(_))) {
            let name = self.ident()?;
            self.punct("=")?;
            let scope = match self.ident()?.as_str() {
                "Shared" => Scope::Shared,
                "Fragment" => Scope::Fragment,
                "Local" => Scope::Local,
                s => return Err(format!("unknown tile scope `{s}`")),
            };
            self.punct("<")?;
            let t = self.ident()?;
            let dtype = dtype_named(&t).ok_or(format!("unknown type `{t}`"))?;
            self.punct(">")?;
            self.punct("[")?;
            let mut shape = vec![];
            while !self.is_punct("]") {
                shape.push(self.uint()? as u32);
                if self.is_punct(",") {
                    self.punct(",")?;
                }
            }
            self.punct("]")?;
            let lanes_per_row = if self.is_ident("lanes_per_row") { self.setting("lanes_per_row")? as u32 } else { 4 };
            self.def.buffers.push(Buffer { name, scope, shape, dtype, loc: SrcLoc::default(), lanes_per_row });
        }
        self.def.body = self.block()?;
        if self.at != self.toks.len() {
            self.last.set(self.at);
            return Err("text after the kernel".to_string());
        }
        Ok(())
    }
}

/// Reads a kernel in the text form `KernelDef`'s `Display` prints (dump header comments
/// allowed); an error names the line. Source locations are not in the text: they come back as
/// the default.
pub fn parse_kernel(text: &str) -> Result<KernelDef, String> {
    let def = KernelDef::empty("", SrcLoc::default());
    let (toks, lines) = tokenize(text)?.into_iter().unzip();
    let mut p = Parser { toks, lines, at: 0, last: std::cell::Cell::new(0), def };
    if let Err(e) = p.kernel() {
        let at = p.last.get().min(p.lines.len().saturating_sub(1));
        let line = p.lines.get(at).copied().unwrap_or(1);
        return Err(format!("line {line}: {e}"));
    }
    Ok(p.def)
}

/// `def` with every source location reset to the default: what [`parse_kernel`] can give back.
pub fn without_locs(def: &KernelDef) -> KernelDef {
    fn strip(body: &mut [Stmt]) {
        for s in body {
            s.loc = SrcLoc::default();
            match &mut s.kind {
                StmtKind::For { body, .. }
                | StmtKind::Parallel { body, .. }
                | StmtKind::WarpGroup { body, .. }
                | StmtKind::Producer(body) => strip(body),
                StmtKind::If(_, t, e) => {
                    strip(t);
                    strip(e);
                }
                _ => {}
            }
        }
    }
    let mut d = def.clone();
    d.loc = SrcLoc::default();
    let ids: Vec<BufId> = d.buffers.iter_ids().map(|(id, _)| id).collect();
    for id in ids {
        d.buffers[id].loc = SrcLoc::default();
    }
    strip(&mut d.body);
    d
}

#[cfg(test)]
mod tests {
    use super::parse_kernel;

    const KERNEL: &str = "kernel k(M: dim, o: mut f32[M]) threads=32 grid=[1, 1, 1] {
  vars bx#0: i32
  block_vars [bx#0, _, _]
  s = Shared<f32>[16]
  fill s = 1.0
  copy s -> o[(0 Mul 16); 16]
}
";

    #[test]
    fn a_kernel_reads_back_and_an_error_names_its_line() {
        let def = parse_kernel(KERNEL).expect("parses");
        assert_eq!(def.to_string(), KERNEL);
        let bad = KERNEL.replace("fill s = 1.0", "fill s = = 1.0");
        let e = parse_kernel(&bad).expect_err("malformed");
        assert!(e.starts_with("line 5: "), "{e}");
        let e = parse_kernel(&KERNEL.replace("Shared<f32>", "Shared<f32>$")).expect_err("a stray character");
        assert!(e.starts_with("line 4: unexpected character `$`"), "{e}");
        let e = parse_kernel(&format!("{KERNEL}extra")).expect_err("trailing text");
        assert_eq!(e, "line 8: text after the kernel");
    }
}
