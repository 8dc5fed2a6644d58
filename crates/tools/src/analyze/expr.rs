//! Constant expressions of `-D` values and `#define`s: enough of C's integer
//! arithmetic and `sizeof` to size allocations and count loop trips.

use std::collections::BTreeMap;

pub(super) fn sizeof_type(name: &str) -> Option<u64> {
    let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(match name.as_str() {
        "char" | "int8_t" | "uint8_t" | "unsigned char" | "signed char" => 1,
        "short" | "int16_t" | "uint16_t" | "unsigned short" => 2,
        "int" | "float" | "int32_t" | "uint32_t" | "unsigned" | "unsigned int" => 4,
        "double" | "long" | "long long" | "int64_t" | "uint64_t" | "size_t" | "unsigned long"
        | "unsigned long long" => 8,
        "lvector double" | "lvector long" | "lvector float" | "lvector int" => 128,
        n if n.ends_with('*') => 8,
        _ => return None,
    })
}

/// A small evaluator for integer constant expressions with macros.
pub(super) struct Evaluator<'a> {
    macros: &'a BTreeMap<String, String>,
    depth: u32,
}

impl<'a> Evaluator<'a> {
    /// An evaluator that expands `macros` (at most 16 levels deep).
    pub(super) fn new(macros: &'a BTreeMap<String, String>) -> Self {
        Evaluator { macros, depth: 0 }
    }

    pub(super) fn eval(&mut self, expr: &str) -> Option<u64> {
        if self.depth > 16 {
            return None;
        }
        let tokens = tokenize(expr)?;
        let mut pos = 0;
        let value = self.sum(&tokens, &mut pos)?;
        (pos == tokens.len()).then_some(value)
    }

    fn sum(&mut self, t: &[Tok], pos: &mut usize) -> Option<u64> {
        let mut v = self.product(t, pos)?;
        while let Some(Tok::Op(op @ ('+' | '-'))) = t.get(*pos) {
            *pos += 1;
            let r = self.product(t, pos)?;
            v = if *op == '+' {
                v.checked_add(r)?
            } else {
                v.checked_sub(r)?
            };
        }
        Some(v)
    }

    fn product(&mut self, t: &[Tok], pos: &mut usize) -> Option<u64> {
        let mut v = self.atom(t, pos)?;
        while let Some(Tok::Op(op @ ('*' | '/' | '%'))) = t.get(*pos) {
            *pos += 1;
            let r = self.atom(t, pos)?;
            v = match op {
                '*' => v.checked_mul(r)?,
                '/' => v.checked_div(r)?,
                _ => v.checked_rem(r)?,
            };
        }
        Some(v)
    }

    fn atom(&mut self, t: &[Tok], pos: &mut usize) -> Option<u64> {
        match t.get(*pos)?.clone() {
            Tok::Num(n) => {
                *pos += 1;
                Some(n)
            }
            Tok::Op('(') => {
                // A cast `(type)` is skipped; otherwise a parenthesized sum.
                if let Some(close) = t[*pos..].iter().position(|x| *x == Tok::Op(')')) {
                    let inner = &t[*pos + 1..*pos + close];
                    if !inner.is_empty()
                        && inner
                            .iter()
                            .all(|x| matches!(x, Tok::Ident(_) | Tok::Op('*')))
                    {
                        let as_type: Vec<String> = inner
                            .iter()
                            .map(|x| match x {
                                Tok::Ident(s) => s.clone(),
                                _ => "*".into(),
                            })
                            .collect();
                        if sizeof_type(&as_type.join(" ")).is_some() {
                            *pos += close + 1;
                            return self.atom(t, pos);
                        }
                    }
                }
                *pos += 1;
                let v = self.sum(t, pos)?;
                if t.get(*pos) != Some(&Tok::Op(')')) {
                    return None;
                }
                *pos += 1;
                Some(v)
            }
            Tok::Ident(name) if name == "sizeof" => {
                *pos += 1;
                if t.get(*pos) != Some(&Tok::Op('(')) {
                    return None;
                }
                let close = t[*pos..].iter().position(|x| *x == Tok::Op(')'))?;
                let inner: Vec<String> = t[*pos + 1..*pos + close]
                    .iter()
                    .map(|x| match x {
                        Tok::Ident(s) => s.clone(),
                        Tok::Op(c) => c.to_string(),
                        Tok::Num(n) => n.to_string(),
                    })
                    .collect();
                *pos += close + 1;
                sizeof_type(&inner.join(" "))
            }
            Tok::Ident(name) => {
                *pos += 1;
                let body = self.macros.get(&name)?.clone();
                self.depth += 1;
                let v = self.eval(&body);
                self.depth -= 1;
                v
            }
            Tok::Op(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Num(u64),
    Ident(String),
    Op(char),
}

pub(super) fn tokenize(expr: &str) -> Option<Vec<Tok>> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let mut j = i;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric()) {
                j += 1;
            }
            let text: String = chars[i..j].iter().collect();
            let digits = text.trim_end_matches(['u', 'U', 'l', 'L']);
            let n = if let Some(hex) = digits
                .strip_prefix("0x")
                .or_else(|| digits.strip_prefix("0X"))
            {
                u64::from_str_radix(hex, 16).ok()?
            } else {
                digits.parse().ok()?
            };
            out.push(Tok::Num(n));
            i = j;
        } else if is_ident(c) {
            let mut j = i;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            out.push(Tok::Ident(chars[i..j].iter().collect()));
            i = j;
        } else if "+-*/%()".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

pub(super) fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}
