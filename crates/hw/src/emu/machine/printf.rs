//! `hthread_printf` for device code: C format strings with their arguments
//! read from the wasm32 `va_list` in device memory.
//!
//! What a core prints goes to the launch's device output (shown with the
//! run's log, prefixed by the core), never to the stream the figures are
//! read from. Unsupported conversions are printed as written.

use super::memory::DeviceMemory;

/// Longest format string read.
const MAX_FORMAT: u64 = 4096;
/// Longest `%s` argument read.
const MAX_STRING: u64 = 4096;

/// Where the next argument is in the `va_list` area.
struct Args<'a> {
    memory: &'a DeviceMemory,
    at: u64,
}

impl Args<'_> {
    fn take(&mut self, size: u64) -> u64 {
        // wasm32 va_list: each argument aligned to its own size.
        self.at = self.at.div_ceil(size) * size;
        let bytes = self.memory.read(self.at, size).unwrap_or_default();
        self.at += size;
        let mut word = [0u8; 8];
        for (i, b) in bytes.iter().enumerate().take(8) {
            word[i] = *b;
        }
        u64::from_le_bytes(word)
    }
}

/// Format `fmt` (at device address `fmt`) with the arguments at `va`.
pub(crate) fn format(memory: &DeviceMemory, fmt: u32, va: u32) -> String {
    let text = memory
        .c_string(u64::from(fmt), MAX_FORMAT)
        .unwrap_or_else(|e| format!("<bad format string: {e}>"));
    let mut args = Args {
        memory,
        at: u64::from(va),
    };
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = String::from("%");
        let mut flags = String::new();
        while let Some(&f) = chars.peek() {
            if "-+ #0".contains(f) {
                flags.push(f);
                spec.push(f);
                chars.next();
            } else {
                break;
            }
        }
        let mut width = None;
        if chars.peek() == Some(&'*') {
            chars.next();
            width = Some(args.take(4) as u32 as i32 as i64);
        } else {
            let mut digits = String::new();
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                digits.push(d);
                chars.next();
            }
            width = digits.parse().ok().or(width);
        }
        let mut precision = None;
        if chars.peek() == Some(&'.') {
            chars.next();
            if chars.peek() == Some(&'*') {
                chars.next();
                precision = Some(args.take(4) as u32 as i32 as i64);
            } else {
                let mut digits = String::new();
                while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(d);
                    chars.next();
                }
                precision = Some(digits.parse().unwrap_or(0));
            }
        }
        let mut long = 0;
        while let Some(&l) = chars.peek() {
            match l {
                'l' => long += 1,
                'h' | 'z' | 't' | 'L' => {}
                'j' => long = 2,
                _ => break,
            }
            chars.next();
        }
        let Some(conv) = chars.next() else {
            out.push_str(&spec);
            break;
        };
        // wasm32: int and long are 4 bytes, long long 8.
        let int_size = if long >= 2 { 8 } else { 4 };
        let body = match conv {
            '%' => "%".to_owned(),
            'd' | 'i' => {
                let v = args.take(int_size);
                let v = if int_size == 8 {
                    v as i64
                } else {
                    v as u32 as i32 as i64
                };
                signed(v, &flags)
            }
            'u' => args.take(int_size).to_string(),
            'x' => format!("{:x}", args.take(int_size)),
            'X' => format!("{:X}", args.take(int_size)),
            'o' => format!("{:o}", args.take(int_size)),
            'p' => format!("{:#x}", args.take(4)),
            'c' => char::from_u32(args.take(4) as u32)
                .unwrap_or('?')
                .to_string(),
            's' => {
                let at = args.take(4);
                let s = memory.c_string(at, MAX_STRING).unwrap_or_default();
                match precision {
                    Some(p) if p >= 0 => s.chars().take(p as usize).collect(),
                    _ => s,
                }
            }
            'f' | 'F' | 'e' | 'E' | 'g' | 'G' => {
                let v = f64::from_bits(args.take(8));
                let p = precision.filter(|p| *p >= 0).unwrap_or(6) as usize;
                let s = float(v, conv, p);
                if v.is_sign_positive() && flags.contains('+') {
                    format!("+{s}")
                } else {
                    s
                }
            }
            other => {
                spec.push(other);
                spec
            }
        };
        pad(&mut out, &body, width.unwrap_or(0), &flags);
    }
    out
}

fn signed(v: i64, flags: &str) -> String {
    if v >= 0 && flags.contains('+') {
        format!("+{v}")
    } else if v >= 0 && flags.contains(' ') {
        format!(" {v}")
    } else {
        v.to_string()
    }
}

fn float(v: f64, conv: char, p: usize) -> String {
    if !v.is_finite() {
        let s = if v.is_nan() {
            "nan"
        } else if v > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        return if conv.is_ascii_uppercase() {
            s.to_uppercase()
        } else {
            s.to_owned()
        };
    }
    let s = match conv {
        'f' | 'F' => format!("{v:.p$}"),
        'e' | 'E' => c_exponent(&format!("{v:.p$e}")),
        _ => {
            // %g: the shorter of %e and %f at precision P (at least 1),
            // trailing zeros removed.
            let p = p.max(1);
            let exp = if v == 0.0 {
                0
            } else {
                v.abs().log10().floor() as i64
            };
            let s = if exp < -4 || exp >= p as i64 {
                c_exponent(&format!("{v:.*e}", p - 1))
            } else {
                let decimals = (p as i64 - 1 - exp).max(0) as usize;
                format!("{v:.decimals$}")
            };
            trim_zeros(&s)
        }
    };
    if conv.is_ascii_uppercase() {
        s.to_uppercase()
    } else {
        s
    }
}

/// Rust's `1.5e3` as C's `1.5e+03`.
fn c_exponent(s: &str) -> String {
    let Some((mantissa, exp)) = s.split_once('e') else {
        return s.to_owned();
    };
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

fn trim_zeros(s: &str) -> String {
    let (mantissa, exp) = match s.split_once('e') {
        Some((m, e)) => (m, Some(e)),
        None => (s, None),
    };
    let mantissa = if mantissa.contains('.') {
        mantissa.trim_end_matches('0').trim_end_matches('.')
    } else {
        mantissa
    };
    match exp {
        Some(e) => format!("{mantissa}e{e}"),
        None => mantissa.to_owned(),
    }
}

fn pad(out: &mut String, body: &str, width: i64, flags: &str) {
    let width = width.unsigned_abs() as usize;
    let fill = width.saturating_sub(body.chars().count());
    if flags.contains('-') {
        out.push_str(body);
        out.extend(std::iter::repeat_n(' ', fill));
    } else if flags.contains('0')
        && body
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '-')
    {
        let (sign, digits) = match body.strip_prefix('-') {
            Some(d) => ("-", d),
            None => ("", body),
        };
        out.push_str(sign);
        out.extend(std::iter::repeat_n('0', fill));
        out.push_str(digits);
    } else {
        out.extend(std::iter::repeat_n(' ', fill));
        out.push_str(body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_c_prints_them() {
        assert_eq!(float(1234.5, 'e', 3), "1.234e+03");
        assert_eq!(float(0.000125, 'g', 6), "0.000125");
        assert_eq!(float(1e-7, 'g', 6), "1e-07");
        assert_eq!(float(2.5, 'f', 2), "2.50");
        assert_eq!(float(f64::NAN, 'f', 2), "nan");
        assert_eq!(float(100000.0, 'g', 6), "100000");
    }

    #[test]
    fn padding_follows_the_flags() {
        let mut s = String::new();
        pad(&mut s, "42", 5, "0");
        pad(&mut s, "|", 0, "");
        pad(&mut s, "-7", 4, "0");
        pad(&mut s, "ab", 4, "-");
        assert_eq!(s, "00042|-007ab  ");
    }
}
