//! Templates and expressions, parsed once: text, `{{ expression }}`,
//! `{% if %}…{% elif %}…{% else %}…{% endif %}` and `{# comments #}`,
//! with Jinja2's operator precedence. Other tags (`for`, `set`, macros)
//! are refused by name.

use super::InterpolationError;
use super::Reach;
use super::value::Val;

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Text(String),
    Expr(Expr),
    If { branches: Vec<(Expr, Vec<Node>)>, otherwise: Vec<Node> },
}

/// An expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Lit(Val),
    Name(String),
    List(Vec<Expr>),
    Dict(Vec<(Expr, Expr)>),
    Attr(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    Slice(Box<Expr>, Option<Box<Expr>>, Option<Box<Expr>>),
    Call(Box<Expr>, Vec<Expr>, Vec<(String, Expr)>),
    Filter(Box<Expr>, String, Vec<Expr>),
    Test(Box<Expr>, String, bool),
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `a < b <= c`: each comparison with the next operand.
    Compare(Box<Expr>, Vec<(CmpOp, Expr)>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Cond {
        then: Box<Expr>,
        cond: Box<Expr>,
        otherwise: Option<Box<Expr>>,
    },
}

/// The variables `nodes` name (a macro's name where it is called is not
/// one).
pub(crate) fn names(nodes: &[Node], out: &mut Vec<String>) {
    for node in nodes {
        match node {
            Node::Text(_) => {}
            Node::Expr(e) => expr_names(e, out),
            Node::If { branches, otherwise } => {
                for (cond, body) in branches {
                    expr_names(cond, out);
                    names(body, out);
                }
                names(otherwise, out);
            }
        }
    }
}

/// What `nodes` read of the variable `name` ([`Reach`]).
pub(crate) fn reach(nodes: &[Node], name: &str, out: &mut Reach) {
    for node in nodes {
        match node {
            Node::Text(_) => {}
            Node::Expr(e) => expr_reach(e, name, out),
            Node::If { branches, otherwise } => {
                for (cond, body) in branches {
                    expr_reach(cond, name, out);
                    reach(body, name, out);
                }
                reach(otherwise, name, out);
            }
        }
    }
}

fn expr_reach(e: &Expr, name: &str, out: &mut Reach) {
    if let Some((path, others)) = key_path(e, name) {
        out.add(path);
        others.into_iter().for_each(|o| expr_reach(o, name, out));
        return;
    }
    match e {
        Expr::Lit(_) | Expr::Name(_) => {}
        Expr::List(items) => items.iter().for_each(|i| expr_reach(i, name, out)),
        Expr::Dict(entries) => entries.iter().for_each(|(k, v)| {
            expr_reach(k, name, out);
            expr_reach(v, name, out);
        }),
        Expr::Attr(t, _) | Expr::Neg(t) | Expr::Not(t) | Expr::Test(t, _, _) => expr_reach(t, name, out),
        Expr::Index(a, b) | Expr::Binary(_, a, b) | Expr::And(a, b) | Expr::Or(a, b) => {
            expr_reach(a, name, out);
            expr_reach(b, name, out);
        }
        Expr::Slice(t, a, b) => {
            expr_reach(t, name, out);
            a.iter().chain(b.iter()).for_each(|e| expr_reach(e, name, out));
        }
        Expr::Call(target, args, kwargs) => {
            match &**target {
                // A method reads all of its receiver.
                Expr::Attr(receiver, _) => expr_reach(receiver, name, out),
                Expr::Name(_) => {}
                other => expr_reach(other, name, out),
            }
            args.iter().chain(kwargs.iter().map(|(_, v)| v)).for_each(|a| expr_reach(a, name, out));
        }
        Expr::Filter(t, _, args) => {
            expr_reach(t, name, out);
            args.iter().for_each(|a| expr_reach(a, name, out));
        }
        Expr::Compare(first, rest) => {
            expr_reach(first, name, out);
            let mut left = &**first;
            for (op, right) in rest {
                // `'key' in name.path` reads whether that key is there.
                match (op, left, key_path(right, name)) {
                    (CmpOp::In | CmpOp::NotIn, Expr::Lit(Val::Str(key)), Some((mut path, others))) => {
                        path.push(key.clone());
                        out.add(path);
                        others.into_iter().for_each(|o| expr_reach(o, name, out));
                    }
                    _ => expr_reach(right, name, out),
                }
                left = right;
            }
        }
        Expr::Cond { then, cond, otherwise } => {
            expr_reach(then, name, out);
            expr_reach(cond, name, out);
            otherwise.iter().for_each(|e| expr_reach(e, name, out));
        }
    }
}

/// The keys `e` follows from the variable `name` (`name.a['b'].get('c',
/// default)`), with the expressions on the way that are not keys (a
/// `get`'s default), if `e` is such a path.
fn key_path<'e>(e: &'e Expr, name: &str) -> Option<(Vec<String>, Vec<&'e Expr>)> {
    let (target, key, others): (&Expr, &str, &[Expr]) = match e {
        Expr::Name(n) if n == name => return Some((Vec::new(), Vec::new())),
        Expr::Attr(target, key) => (target, key, &[]),
        Expr::Index(target, index) => match &**index {
            Expr::Lit(Val::Str(key)) => (target, key, &[]),
            _ => return None,
        },
        Expr::Call(method, args, kwargs) if kwargs.is_empty() && (1..=2).contains(&args.len()) => {
            match (&**method, &args[0]) {
                (Expr::Attr(target, m), Expr::Lit(Val::Str(key))) if m == "get" => (target, key, &args[1..]),
                _ => return None,
            }
        }
        _ => return None,
    };
    let (mut path, mut found) = key_path(target, name)?;
    path.push(key.to_owned());
    found.extend(others);
    Some((path, found))
}

fn expr_names(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::Lit(_) => {}
        Expr::Name(n) => {
            if !out.contains(n) {
                out.push(n.clone());
            }
        }
        Expr::List(items) => items.iter().for_each(|i| expr_names(i, out)),
        Expr::Dict(entries) => entries.iter().for_each(|(k, v)| {
            expr_names(k, out);
            expr_names(v, out);
        }),
        Expr::Attr(t, _) | Expr::Neg(t) | Expr::Not(t) | Expr::Test(t, _, _) => expr_names(t, out),
        Expr::Index(a, b) | Expr::Binary(_, a, b) | Expr::And(a, b) | Expr::Or(a, b) => {
            expr_names(a, out);
            expr_names(b, out);
        }
        Expr::Slice(t, a, b) => {
            expr_names(t, out);
            a.iter().chain(b.iter()).for_each(|e| expr_names(e, out));
        }
        Expr::Call(target, args, kwargs) => {
            if !matches!(**target, Expr::Name(_)) {
                expr_names(target, out);
            }
            args.iter().chain(kwargs.iter().map(|(_, v)| v)).for_each(|a| expr_names(a, out));
        }
        Expr::Filter(t, _, args) => {
            expr_names(t, out);
            args.iter().for_each(|a| expr_names(a, out));
        }
        Expr::Compare(first, rest) => {
            expr_names(first, out);
            rest.iter().for_each(|(_, e)| expr_names(e, out));
        }
        Expr::Cond { then, cond, otherwise } => {
            expr_names(then, out);
            expr_names(cond, out);
            otherwise.iter().for_each(|e| expr_names(e, out));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Rem,
    Pow,
    Concat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    NotIn,
}

/// Parses a template.
pub(crate) fn template(source: &str) -> Result<Vec<Node>, InterpolationError> {
    let mut parts = Parts { source, at: 0 };
    let (nodes, end) = parts.nodes()?;
    match end {
        None => Ok(nodes),
        Some(tag) => Err(syntax(format!("{{% {tag} %}} without an {{% if %}}"))),
    }
}

fn syntax(message: impl Into<String>) -> InterpolationError {
    InterpolationError::Syntax(message.into())
}

/// The template's text, cut at its tags.
struct Parts<'a> {
    source: &'a str,
    at: usize,
}

impl Parts<'_> {
    /// Nodes up to the end, or up to an `elif`, `else` or `endif` tag
    /// (returned with its expression text).
    fn nodes(&mut self) -> Result<(Vec<Node>, Option<String>), InterpolationError> {
        let mut nodes = Vec::new();
        loop {
            let rest = &self.source[self.at..];
            let next = ["{{", "{%", "{#"].iter().filter_map(|open| rest.find(open).map(|i| (i, *open))).min();
            let Some((offset, open)) = next else {
                if !rest.is_empty() {
                    nodes.push(Node::Text(rest.to_owned()));
                }
                self.at = self.source.len();
                return Ok((nodes, None));
            };
            let mut text = rest[..offset].to_owned();
            let close = match open {
                "{{" => "}}",
                "{%" => "%}",
                _ => "#}",
            };
            let body_start = self.at + offset + 2;
            let end = self.source[body_start..]
                .find(close)
                .ok_or_else(|| syntax(format!("{open} is not closed with {close}")))?;
            let mut body = &self.source[body_start..body_start + end];
            self.at = body_start + end + 2;
            // Whitespace control: `{{-` trims before, `-}}` after.
            if let Some(trimmed) = body.strip_prefix('-') {
                body = trimmed;
                text.truncate(text.trim_end().len());
            }
            let trim_after = body.ends_with('-');
            if trim_after {
                body = &body[..body.len() - 1];
            }
            if !text.is_empty() {
                nodes.push(Node::Text(text));
            }
            match open {
                "{{" => nodes.push(Node::Expr(expression(body)?)),
                "{%" => {
                    let tag = body.trim();
                    let (word, rest) = tag.split_once(char::is_whitespace).unwrap_or((tag, ""));
                    match word {
                        "if" => {
                            if trim_after {
                                self.skip_whitespace();
                            }
                            nodes.push(self.conditional(rest)?);
                        }
                        "elif" | "else" | "endif" => {
                            if trim_after {
                                self.skip_whitespace();
                            }
                            return Ok((nodes, Some(tag.to_owned())));
                        }
                        other => return Err(InterpolationError::Unsupported(format!("the {{% {other} %}} tag"))),
                    }
                    continue;
                }
                _ => {}
            }
            if trim_after {
                self.skip_whitespace();
            }
        }
    }

    fn skip_whitespace(&mut self) {
        let rest = &self.source[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// An `{% if %}` whose condition is `first`, through its `endif`.
    fn conditional(&mut self, first: &str) -> Result<Node, InterpolationError> {
        let mut branches = Vec::new();
        let mut condition = expression(first)?;
        loop {
            let (body, end) = self.nodes()?;
            let end = end.ok_or_else(|| syntax("{% if %} without {% endif %}"))?;
            let (word, rest) = end.split_once(char::is_whitespace).unwrap_or((end.as_str(), ""));
            branches.push((condition, body));
            match word {
                "elif" => condition = expression(rest)?,
                "else" => {
                    let (otherwise, end) = self.nodes()?;
                    if end.as_deref() != Some("endif") {
                        return Err(syntax("{% else %} must be followed by {% endif %}"));
                    }
                    return Ok(Node::If { branches, otherwise });
                }
                _ => return Ok(Node::If { branches, otherwise: Vec::new() }),
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    Float(f64),
    Str(String),
    Name(String),
    Op(&'static str),
}

const OPS: &[&str] = &[
    "**", "//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",", ":", ".", "|", "~", "+", "-", "*", "/", "%",
    "<", ">", "=",
];

fn tokens(source: &str) -> Result<Vec<Tok>, InterpolationError> {
    let mut out = Vec::new();
    let chars: Vec<char> = source.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '_') {
                i += 1;
            }
            let mut float = false;
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                float = true;
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                float = true;
                i += 1;
                if i < chars.len() && (chars[i] == '+' || chars[i] == '-') {
                    i += 1;
                }
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let text: String = chars[start..i].iter().filter(|c| **c != '_').collect();
            out.push(if float {
                Tok::Float(text.parse().map_err(|_| syntax(format!("{text} is not a number")))?)
            } else {
                Tok::Int(text.parse().map_err(|_| syntax(format!("{text} is not a number")))?)
            });
        } else if c == '\'' || c == '"' {
            let mut text = String::new();
            i += 1;
            loop {
                let Some(&ch) = chars.get(i) else { return Err(syntax("a string is not closed")) };
                i += 1;
                if ch == c {
                    break;
                }
                if ch == '\\' {
                    let Some(&escaped) = chars.get(i) else { return Err(syntax("a string is not closed")) };
                    i += 1;
                    text.push(match escaped {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        other => other,
                    });
                } else {
                    text.push(ch);
                }
            }
            out.push(Tok::Str(text));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Name(chars[start..i].iter().collect()));
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let op = OPS.iter().find(|op| rest.starts_with(**op)).ok_or_else(|| syntax(format!("unexpected {c:?}")))?;
            out.push(Tok::Op(op));
            i += op.len();
        }
    }
    Ok(out)
}

/// Parses one expression.
pub(crate) fn expression(source: &str) -> Result<Expr, InterpolationError> {
    let mut p = Parser { toks: tokens(source)?, at: 0 };
    let e = p.cond()?;
    match p.toks.get(p.at) {
        None => Ok(e),
        Some(t) => Err(syntax(format!("unexpected {} in {:?}", describe(t), source.trim()))),
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Int(i) => i.to_string(),
        Tok::Float(f) => f.to_string(),
        Tok::Str(s) => format!("{s:?}"),
        Tok::Name(n) => n.clone(),
        Tok::Op(o) => (*o).to_owned(),
    }
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
}

/// A call's positional and named arguments.
type Arguments = (Vec<Expr>, Vec<(String, Expr)>);

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Some(Tok::Op(o)) if *o == op)
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Tok::Name(n)) if n == word)
    }

    fn eat_op(&mut self, op: &str) -> bool {
        let found = self.is_op(op);
        self.at += usize::from(found);
        found
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let found = self.is_word(word);
        self.at += usize::from(found);
        found
    }

    fn expect_op(&mut self, op: &str) -> Result<(), InterpolationError> {
        if self.eat_op(op) {
            Ok(())
        } else {
            Err(syntax(format!(
                "expected {op}, found {}",
                self.peek().map(describe).unwrap_or_else(|| "the end".into())
            )))
        }
    }

    fn name(&mut self) -> Result<String, InterpolationError> {
        match self.toks.get(self.at) {
            Some(Tok::Name(n)) => {
                self.at += 1;
                Ok(n.clone())
            }
            other => Err(syntax(format!(
                "expected a name, found {}",
                other.map(describe).unwrap_or_else(|| "the end".into())
            ))),
        }
    }

    fn cond(&mut self) -> Result<Expr, InterpolationError> {
        let then = self.or()?;
        if !self.eat_word("if") {
            return Ok(then);
        }
        let cond = self.or()?;
        let otherwise = if self.eat_word("else") { Some(Box::new(self.cond()?)) } else { None };
        Ok(Expr::Cond { then: Box::new(then), cond: Box::new(cond), otherwise })
    }

    fn or(&mut self) -> Result<Expr, InterpolationError> {
        let mut left = self.and()?;
        while self.eat_word("or") {
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, InterpolationError> {
        let mut left = self.not()?;
        while self.eat_word("and") {
            left = Expr::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr, InterpolationError> {
        if self.eat_word("not") {
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.compare()
    }

    fn compare(&mut self) -> Result<Expr, InterpolationError> {
        let first = self.math1()?;
        let mut rest = Vec::new();
        loop {
            let op = match self.peek() {
                Some(Tok::Op("==")) => CmpOp::Eq,
                Some(Tok::Op("!=")) => CmpOp::Ne,
                Some(Tok::Op("<")) => CmpOp::Lt,
                Some(Tok::Op("<=")) => CmpOp::Le,
                Some(Tok::Op(">")) => CmpOp::Gt,
                Some(Tok::Op(">=")) => CmpOp::Ge,
                Some(Tok::Name(n)) if n == "in" => CmpOp::In,
                Some(Tok::Name(n))
                    if n == "not" && matches!(self.toks.get(self.at + 1), Some(Tok::Name(m)) if m == "in") =>
                {
                    self.at += 1;
                    CmpOp::NotIn
                }
                _ => break,
            };
            self.at += 1;
            rest.push((op, self.math1()?));
        }
        Ok(if rest.is_empty() { first } else { Expr::Compare(Box::new(first), rest) })
    }

    fn math1(&mut self) -> Result<Expr, InterpolationError> {
        let mut left = self.concat()?;
        loop {
            let op = if self.eat_op("+") {
                BinOp::Add
            } else if self.eat_op("-") {
                BinOp::Sub
            } else {
                return Ok(left);
            };
            left = Expr::Binary(op, Box::new(left), Box::new(self.concat()?));
        }
    }

    fn concat(&mut self) -> Result<Expr, InterpolationError> {
        let mut left = self.math2()?;
        while self.eat_op("~") {
            left = Expr::Binary(BinOp::Concat, Box::new(left), Box::new(self.math2()?));
        }
        Ok(left)
    }

    fn math2(&mut self) -> Result<Expr, InterpolationError> {
        let mut left = self.pow()?;
        loop {
            let op = if self.eat_op("*") {
                BinOp::Mul
            } else if self.eat_op("//") {
                BinOp::FloorDiv
            } else if self.eat_op("/") {
                BinOp::Div
            } else if self.eat_op("%") {
                BinOp::Rem
            } else {
                return Ok(left);
            };
            left = Expr::Binary(op, Box::new(left), Box::new(self.pow()?));
        }
    }

    fn pow(&mut self) -> Result<Expr, InterpolationError> {
        let mut left = self.unary()?;
        while self.eat_op("**") {
            left = Expr::Binary(BinOp::Pow, Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, InterpolationError> {
        let e = if self.eat_op("-") {
            Expr::Neg(Box::new(self.unary()?))
        } else if self.eat_op("+") {
            self.unary()?
        } else {
            let primary = self.primary()?;
            self.postfix(primary)?
        };
        self.filters(e)
    }

    fn primary(&mut self) -> Result<Expr, InterpolationError> {
        let Some(tok) = self.toks.get(self.at).cloned() else {
            return Err(syntax("the expression ends early"));
        };
        self.at += 1;
        Ok(match tok {
            Tok::Int(i) => Expr::Lit(Val::Int(i)),
            Tok::Float(f) => Expr::Lit(Val::Float(f)),
            Tok::Str(mut s) => {
                // Adjacent strings join, as in Python.
                while let Some(Tok::Str(next)) = self.peek() {
                    s.push_str(next);
                    self.at += 1;
                }
                Expr::Lit(Val::Str(s))
            }
            Tok::Name(n) => match n.as_str() {
                "true" | "True" => Expr::Lit(Val::Bool(true)),
                "false" | "False" => Expr::Lit(Val::Bool(false)),
                "none" | "None" => Expr::Lit(Val::None),
                _ => Expr::Name(n),
            },
            Tok::Op("(") => {
                let inner = self.cond()?;
                if self.eat_op(",") {
                    // A tuple: a list, as far as anything here is concerned.
                    let mut items = vec![inner];
                    while !self.is_op(")") {
                        items.push(self.cond()?);
                        if !self.eat_op(",") {
                            break;
                        }
                    }
                    self.expect_op(")")?;
                    return Ok(Expr::List(items));
                }
                self.expect_op(")")?;
                inner
            }
            Tok::Op("[") => {
                let mut items = Vec::new();
                while !self.is_op("]") {
                    items.push(self.cond()?);
                    if !self.eat_op(",") {
                        break;
                    }
                }
                self.expect_op("]")?;
                Expr::List(items)
            }
            Tok::Op("{") => {
                let mut entries = Vec::new();
                while !self.is_op("}") {
                    let key = self.cond()?;
                    self.expect_op(":")?;
                    entries.push((key, self.cond()?));
                    if !self.eat_op(",") {
                        break;
                    }
                }
                self.expect_op("}")?;
                Expr::Dict(entries)
            }
            other => return Err(syntax(format!("unexpected {}", describe(&other)))),
        })
    }

    fn postfix(&mut self, mut e: Expr) -> Result<Expr, InterpolationError> {
        loop {
            if self.eat_op(".") {
                let name = match self.toks.get(self.at).cloned() {
                    // `items.0`: Jinja's index by attribute.
                    Some(Tok::Int(i)) => {
                        self.at += 1;
                        e = Expr::Index(Box::new(e), Box::new(Expr::Lit(Val::Int(i))));
                        continue;
                    }
                    _ => self.name()?,
                };
                e = Expr::Attr(Box::new(e), name);
            } else if self.eat_op("[") {
                let start = if self.is_op(":") { None } else { Some(self.cond()?) };
                if self.eat_op(":") {
                    let end = if self.is_op("]") { None } else { Some(Box::new(self.cond()?)) };
                    self.expect_op("]")?;
                    e = Expr::Slice(Box::new(e), start.map(Box::new), end);
                } else {
                    self.expect_op("]")?;
                    let index = start.ok_or_else(|| syntax("an empty subscript"))?;
                    e = Expr::Index(Box::new(e), Box::new(index));
                }
            } else if self.is_op("(") {
                let (args, kwargs) = self.arguments()?;
                e = Expr::Call(Box::new(e), args, kwargs);
            } else {
                return Ok(e);
            }
        }
    }

    /// `(a, b, name=c)`.
    fn arguments(&mut self) -> Result<Arguments, InterpolationError> {
        self.expect_op("(")?;
        let (mut args, mut kwargs) = (Vec::new(), Vec::new());
        while !self.is_op(")") {
            if let (Some(Tok::Name(n)), Some(Tok::Op("="))) = (self.peek().cloned(), self.toks.get(self.at + 1)) {
                self.at += 2;
                kwargs.push((n, self.cond()?));
            } else {
                args.push(self.cond()?);
            }
            if !self.eat_op(",") {
                break;
            }
        }
        self.expect_op(")")?;
        Ok((args, kwargs))
    }

    fn filters(&mut self, mut e: Expr) -> Result<Expr, InterpolationError> {
        loop {
            if self.eat_op("|") {
                let name = self.name()?;
                let args = if self.is_op("(") { self.arguments()?.0 } else { Vec::new() };
                e = Expr::Filter(Box::new(e), name, args);
            } else if self.eat_word("is") {
                let negated = self.eat_word("not");
                let name = match self.toks.get(self.at).cloned() {
                    Some(Tok::Name(n)) => {
                        self.at += 1;
                        n
                    }
                    other => {
                        return Err(syntax(format!(
                            "expected a test after is, found {}",
                            other.map(|t| describe(&t)).unwrap_or_else(|| "the end".into())
                        )));
                    }
                };
                e = Expr::Test(Box::new(e), name, negated);
            } else {
                return Ok(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_follows_jinja() {
        let e = expression("a + b | int").unwrap();
        assert!(
            matches!(&e, Expr::Binary(BinOp::Add, _, right) if matches!(**right, Expr::Filter(_, ref f, _) if f == "int"))
        );
        let e = expression("'x' if a == 1 else 'y'").unwrap();
        assert!(matches!(e, Expr::Cond { otherwise: Some(_), .. }));
        let e = expression("-90.00 <= config['lat']|float <= 90.00").unwrap();
        assert!(matches!(e, Expr::Compare(_, ref rest) if rest.len() == 2));
        assert!(matches!(expression("a not in b").unwrap(), Expr::Compare(_, ref rest) if rest[0].0 == CmpOp::NotIn));
        assert!(matches!(expression("x is not none").unwrap(), Expr::Test(_, ref t, true) if t == "none"));
        assert!(matches!(expression("s[4:6]").unwrap(), Expr::Slice(_, Some(_), Some(_))));
        assert!(
            matches!(expression("f(1, b=2)").unwrap(), Expr::Call(_, ref a, ref k) if a.len() == 1 && k.len() == 1)
        );
    }

    #[test]
    fn templates_split_into_text_expressions_and_conditions() {
        let nodes = template("a{{ x }}b{% if y %}c{% elif z %}d{% else %}e{% endif %}{# note #}").unwrap();
        assert_eq!(nodes.len(), 4);
        assert!(matches!(&nodes[3], Node::If { branches, otherwise } if branches.len() == 2 && otherwise.len() == 1));
        assert!(matches!(template("{% for x in y %}{% endfor %}"), Err(InterpolationError::Unsupported(_))));
        assert!(matches!(template("{{ x "), Err(InterpolationError::Syntax(_))));
        assert!(matches!(template("{% if x %}"), Err(InterpolationError::Syntax(_))));
        assert!(matches!(template("{% endif %}"), Err(InterpolationError::Syntax(_))));
        assert!(matches!(expression("a b"), Err(InterpolationError::Syntax(_))));
    }
}
