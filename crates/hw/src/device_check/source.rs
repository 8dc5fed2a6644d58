//! The preprocessed kernel source against the device contract: attributes,
//! pragmas, inline assembly and host builtins that switch off or dodge the
//! instrumentation are refused, naming the construct and its line.

use std::path::Path;

use super::symbols::RESERVED_PREFIXES;
use crate::HwError;

/// A construct of the preprocessed kernel source that is refused.
#[derive(Debug)]
struct Finding {
    file: String,
    line: usize,
    construct: String,
    reason: &'static str,
}

const INSTRUMENTATION_OFF: &str =
    "it switches off or dodges the instrumentation the cost model charges through";

/// Why a GNU attribute is refused (its name without surrounding `__`).
fn refused_attribute(name: &str, first_arg: Option<&str>) -> Option<&'static str> {
    match name {
        n if n.starts_with("no_sanitize") => Some(INSTRUMENTATION_OFF),
        "no_instrument_function"
        | "no_profile_instrument_function"
        | "no_address_safety_analysis"
        | "no_stack_limit"
        | "optimize"
        | "target"
        | "target_clones"
        | "naked" => Some(INSTRUMENTATION_OFF),
        "weak" | "weakref" | "alias" | "ifunc" | "symver" => {
            Some("weak, alias and ifunc symbols could replace the emulator runtime's functions")
        }
        "constructor" | "destructor" => {
            Some("device code runs only inside a thread group, never at host start-up or exit")
        }
        "section" if first_arg != Some("mtswarm_gsm") => {
            Some("only `__gsm__` may place device data in a section")
        }
        _ => None,
    }
}

/// Why a `#pragma` is refused.
fn refused_pragma(words: &[&str]) -> Option<&'static str> {
    let words: Vec<&str> = words.iter().map(|w| w.trim_start_matches("__")).collect();
    match words.as_slice() {
        ["GCC", "optimize" | "target" | "reset_options", ..] => Some(INSTRUMENTATION_OFF),
        ["weak", ..] | ["redefine_extname", ..] => {
            Some("weak and renamed symbols could replace the emulator runtime's functions")
        }
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Punct(char),
}

/// Scan preprocessed text (`gcc -E`, with line markers). Only text that
/// came from files under `kernel_dir` is checked: the emulator's own headers
/// use some of these constructs on purpose.
pub fn check_preprocessed(text: &str, kernel_dir: &Path) -> Result<(), HwError> {
    let mut file = String::new();
    let mut line_no = 0usize;
    let mut in_kernel = false;
    // Tokens of kernel files with their (file, line).
    let mut toks: Vec<(Tok, String, usize)> = Vec::new();
    for raw in text.lines() {
        let trimmed = raw.trim_start();
        if let Some(rest) = trimmed.strip_prefix('#') {
            let rest = rest.trim_start();
            let mut words = rest.split_whitespace();
            let first = words.next().unwrap_or("");
            if let Ok(n) = first.parse::<usize>() {
                // `# 12 "path" flags`: the next line is line 12 of path.
                if let Some(name) = rest[first.len()..].trim_start().strip_prefix('"') {
                    let name = name.split('"').next().unwrap_or("");
                    file = name.to_owned();
                    in_kernel = is_under(Path::new(name), kernel_dir);
                }
                line_no = n;
                continue;
            }
            if first == "pragma" && in_kernel {
                // Identifiers only: `optimize("O1")` is the word `optimize`.
                let words: Vec<&str> = words
                    .flat_map(|w| w.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
                    .filter(|w| !w.is_empty())
                    .collect();
                if let Some(reason) = refused_pragma(&words) {
                    return Err(refusal(&Finding {
                        file: file.clone(),
                        line: line_no,
                        construct: format!("#pragma {}", words.join(" ")),
                        reason,
                    }));
                }
            }
            line_no += 1;
            continue;
        }
        if in_kernel {
            for tok in tokenize(raw) {
                toks.push((tok, file.clone(), line_no));
            }
        }
        line_no += 1;
    }
    if let Some(finding) = scan_tokens(&toks) {
        return Err(refusal(&finding));
    }
    Ok(())
}

fn refusal(f: &Finding) -> HwError {
    let name = Path::new(&f.file)
        .file_name()
        .map_or_else(|| f.file.clone(), |n| n.to_string_lossy().into_owned());
    HwError::compile(format!(
        "{name}:{}: refused: `{}`: {}",
        f.line, f.construct, f.reason
    ))
}

fn is_under(path: &Path, dir: &Path) -> bool {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.starts_with(dir)
}

/// A small C tokenizer: identifiers, string/char literals and punctuation
/// (numbers become identifiers, which is harmless here).
fn tokenize(line: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c == '"' || c == '\'' {
            let quote = c;
            i += 1;
            let mut s = String::new();
            while i < chars.len() && chars[i] != quote {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    i += 1;
                }
                s.push(chars[i]);
                i += 1;
            }
            i += 1;
            out.push(Tok::Str(s));
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

fn scan_tokens(toks: &[(Tok, String, usize)]) -> Option<Finding> {
    let found = |i: usize, construct: String, reason: &'static str| {
        let (_, file, line) = &toks[i];
        Some(Finding {
            file: file.clone(),
            line: *line,
            construct,
            reason,
        })
    };
    let mut i = 0;
    while i < toks.len() {
        let Tok::Ident(word) = &toks[i].0 else {
            // C2x `[[gnu::name]]` attributes.
            if toks[i].0 == Tok::Punct('[')
                && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Punct('['))
                && let Some(f) = scan_attribute_list(toks, i + 2, ']')
            {
                return Some(f);
            }
            i += 1;
            continue;
        };
        match word.as_str() {
            "asm" | "__asm" | "__asm__" => {
                return found(
                    i,
                    word.clone(),
                    "inline assembly and assembler symbol names are invisible to the cost model",
                );
            }
            "__attribute__" | "__attribute" => {
                // __attribute__ (( list ))
                if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Punct('('))
                    && toks.get(i + 2).map(|t| &t.0) == Some(&Tok::Punct('('))
                    && let Some(f) = scan_attribute_list(toks, i + 3, ')')
                {
                    return Some(f);
                }
            }
            w if w.starts_with("__builtin_ia32_") || w == "__builtin_cpu_supports" => {
                return found(
                    i,
                    word.clone(),
                    "host (x86) instruction builtins do not exist on the DSP and bypass the cost \
                     model",
                );
            }
            w if RESERVED_PREFIXES.iter().any(|p| w.starts_with(p)) => {
                return found(
                    i,
                    word.clone(),
                    "names of the emulator's instrumentation are reserved",
                );
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Attribute names at the top level of a list that ends with `close` (a
/// `))` or `]]`), each optionally followed by `(args)`.
fn scan_attribute_list(
    toks: &[(Tok, String, usize)],
    mut i: usize,
    close: char,
) -> Option<Finding> {
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct(c) if *c == close => return None,
            Tok::Ident(name) => {
                // gnu::name, __gnu__::name
                let mut name = name.clone();
                if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Punct(':'))
                    && toks.get(i + 2).map(|t| &t.0) == Some(&Tok::Punct(':'))
                    && let Some((Tok::Ident(inner), _, _)) = toks.get(i + 3)
                {
                    name = inner.clone();
                    i += 3;
                }
                let base = name.trim_start_matches("__").trim_end_matches("__");
                let mut first_arg = None;
                let mut j = i + 1;
                if toks.get(j).map(|t| &t.0) == Some(&Tok::Punct('(')) {
                    if let Some((Tok::Str(s), _, _)) = toks.get(j + 1) {
                        first_arg = Some(s.as_str());
                    }
                    // Skip the balanced argument list.
                    let mut depth = 0usize;
                    while j < toks.len() {
                        match toks[j].0 {
                            Tok::Punct('(') => depth += 1,
                            Tok::Punct(')') => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                }
                if let Some(reason) = refused_attribute(base, first_arg) {
                    let (_, file, line) = &toks[i];
                    let construct = match first_arg {
                        Some(a) => format!("__attribute__(({base}(\"{a}\")))"),
                        None => format!("__attribute__(({base}))"),
                    };
                    return Some(Finding {
                        file: file.clone(),
                        line: *line,
                        construct,
                        reason,
                    });
                }
                i = j + 1;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}
