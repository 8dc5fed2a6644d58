//! The lexical scan of device code: comments and literals blanked, loops
//! found by their headers with their trip counts where evaluable.

use super::LoopInfo;
use super::expr::{Evaluator, is_ident};

/// Replace comments and string/char literals by spaces, keeping newlines so
/// line numbers stay right.
pub(super) fn strip_comments(source: &str) -> String {
    let bytes: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < bytes.len() && bytes[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            out.push_str("  ");
            i += 2;
            while i < bytes.len() && !(bytes[i] == '*' && bytes.get(i + 1) == Some(&'/')) {
                out.push(if bytes[i] == '\n' { '\n' } else { ' ' });
                i += 1;
            }
            out.push_str("  ");
            i += 2;
        } else if c == '"' || c == '\'' {
            out.push(c);
            i += 1;
            while i < bytes.len() && bytes[i] != c && bytes[i] != '\n' {
                if bytes[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < bytes.len() {
                    out.push(' ');
                    i += 1;
                }
            }
            if i < bytes.len() {
                out.push(bytes[i]);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Index just past the parenthesized group starting at `open` (a `(`).
pub(super) fn skip_parens(chars: &[char], open: usize) -> usize {
    skip_balanced(chars, open, '(', ')')
}

/// Just past the `close` that balances the `open` at or after `start`
/// (the end of `chars` when it is never balanced).
fn skip_balanced(chars: &[char], start: usize, open: char, close: char) -> usize {
    let mut depth = 0i32;
    for (j, c) in chars.iter().enumerate().skip(start) {
        if *c == open {
            depth += 1;
        } else if *c == close {
            depth -= 1;
            if depth == 0 {
                return j + 1;
            }
        }
    }
    chars.len()
}

pub(super) fn skip_space(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    i
}

/// Find loops and their nesting depth by tracking braces and brace-less
/// loop bodies.
/// End (exclusive, in chars) of the statement or block starting at `i`.
pub(super) fn statement_end(chars: &[char], i: usize) -> usize {
    let i = skip_space(chars, i);
    if chars.get(i) == Some(&'{') {
        return skip_balanced(chars, i, '{', '}');
    }
    let mut parens = 0i32;
    let mut braces = 0i32;
    for (j, c) in chars.iter().enumerate().skip(i) {
        match c {
            '(' => parens += 1,
            ')' => parens -= 1,
            '{' => braces += 1,
            '}' => {
                braces -= 1;
                if braces < 0 {
                    return j;
                }
                if braces == 0 && parens == 0 {
                    return j + 1;
                }
            }
            ';' if parens == 0 && braces == 0 => return j + 1,
            _ => {}
        }
    }
    chars.len()
}

/// Trip count of `init; cond; step` when it is `v = 0; v < N; v++` (or
/// `<=`, `++v`, `v += 1`) with `N` evaluable.
pub(super) fn trip_count(header: &str, evaluator: &mut Evaluator<'_>) -> Option<u64> {
    let parts: Vec<&str> = header.split(';').map(str::trim).collect();
    let [init, cond, step] = parts.as_slice() else {
        return None;
    };
    let (lhs, start) = init.rsplit_once('=')?;
    let var = lhs.split_whitespace().last()?.trim_start_matches('*');
    if evaluator.eval(start.trim())? != 0 {
        return None;
    }
    let step = step.replace(' ', "");
    if step != format!("{var}++") && step != format!("++{var}") && step != format!("{var}+=1") {
        return None;
    }
    if let Some(bound) = cond.strip_prefix(var).map(str::trim_start) {
        if let Some(e) = bound.strip_prefix("<=") {
            return evaluator.eval(e.trim())?.checked_add(1);
        }
        if let Some(e) = bound.strip_prefix('<') {
            return evaluator.eval(e.trim());
        }
    }
    None
}

pub(super) fn find_loops(code: &str) -> Vec<LoopInfo> {
    let chars: Vec<char> = code.chars().collect();
    // Byte offsets for line numbers.
    let offsets: Vec<usize> = code.char_indices().map(|(b, _)| b).collect();
    let mut loops = Vec::new();
    // Loops opened by each brace on the stack.
    let mut brace_loops: Vec<u32> = Vec::new();
    let mut pending: u32 = 0;
    let mut paren_depth = 0i32;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let word_start = i == 0 || !is_ident(chars[i - 1]);
        if word_start && c.is_ascii_alphabetic() {
            let mut j = i;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            let word: String = chars[i..j].iter().collect();
            if word == "for" || word == "while" || word == "do" {
                let active: u32 = brace_loops.iter().sum::<u32>() + pending;
                let after = skip_space(&chars, j);
                if word == "do" {
                    loops.push(LoopInfo {
                        line: line_of(code, offsets[i]),
                        kind: word,
                        depth: active + 1,
                        trip_count: None,
                        header: String::new(),
                        body: (after, statement_end(&chars, after)),
                    });
                    pending += 1;
                    i = after;
                    continue;
                }
                if chars.get(after) == Some(&'(') {
                    let end = skip_parens(&chars, after);
                    let next = skip_space(&chars, end);
                    // `while (...);` closes a do-while: not a new loop.
                    if word == "while" && chars.get(next) == Some(&';') {
                        i = next + 1;
                        continue;
                    }
                    loops.push(LoopInfo {
                        line: line_of(code, offsets[i]),
                        kind: word,
                        depth: active + 1,
                        trip_count: None,
                        header: chars[after + 1..end.saturating_sub(1).max(after + 1)]
                            .iter()
                            .collect(),
                        body: (end, statement_end(&chars, end)),
                    });
                    pending += 1;
                    i = end;
                    continue;
                }
            }
            i = j;
            continue;
        }
        match c {
            '(' => paren_depth += 1,
            ')' => paren_depth -= 1,
            '{' => {
                brace_loops.push(pending);
                pending = 0;
            }
            '}' => {
                brace_loops.pop();
                pending = 0;
            }
            ';' if paren_depth <= 0 => pending = 0,
            _ => {}
        }
        i += 1;
    }
    let byte = |ci: usize| offsets.get(ci).copied().unwrap_or(code.len());
    for l in &mut loops {
        l.body = (byte(l.body.0), byte(l.body.1));
    }
    loops
}
