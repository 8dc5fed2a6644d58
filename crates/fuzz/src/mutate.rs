//! New inputs from old ones: the byte-level mutations of coverage-guided
//! fuzzers (bit flips, interesting bytes and numbers, deletions,
//! duplications, repetition into huge fields, splices of two inputs,
//! dictionary tokens of the target's format), drawn from `rand`. A
//! coverage-guided engine (libFuzzer, AFL) needs a nightly compiler or an
//! instrumented build; these mutations need neither.

use rand::Rng;
use rand::rngs::StdRng;

/// Bytes that parsers branch on.
const INTERESTING_BYTES: &[u8] = &[
    0, 0x7f, 0x80, 0xff, 0xc3, 0xe2, b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'\n', b'\r',
    b' ', b'=', b'#', b'-', b'.', b'0', b'9', b'e',
];

/// Numbers that sit at the edges of the types parsers read them into.
const INTERESTING_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "255",
    "65536",
    "2147483647",
    "-2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "1e309",
    "-1e309",
    "0.5",
    "1e-320",
    "NaN",
    "inf",
];

/// Applies one to four mutations to a copy of `input`; `other` is a second
/// input to splice with; the result is at most `max_len` bytes.
pub(crate) fn mutate(
    rng: &mut StdRng,
    input: &[u8],
    other: &[u8],
    dictionary: &[&[u8]],
    max_len: usize,
) -> Vec<u8> {
    let mut data = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        mutate_once(rng, &mut data, other, dictionary, max_len);
    }
    data.truncate(max_len);
    data
}

fn mutate_once(
    rng: &mut StdRng,
    data: &mut Vec<u8>,
    other: &[u8],
    dictionary: &[&[u8]],
    max_len: usize,
) {
    let len = data.len();
    let at = |rng: &mut StdRng| rng.random_range(0..=len);
    match rng.random_range(0..11) {
        0 if len > 0 => {
            let i = rng.random_range(0..len);
            data[i] ^= 1 << rng.random_range(0..8);
        }
        1 if len > 0 => {
            let i = rng.random_range(0..len);
            data[i] = INTERESTING_BYTES[rng.random_range(0..INTERESTING_BYTES.len())];
        }
        2 if len > 0 => {
            let start = rng.random_range(0..len);
            let end = (start + rng.random_range(1..=16.min(len - start))).min(len);
            data.drain(start..end);
        }
        3 if len > 0 => {
            let start = rng.random_range(0..len);
            let end = (start + rng.random_range(1..=64.min(len - start))).min(len);
            let piece = data[start..end].to_vec();
            let to = at(rng);
            data.splice(to..to, piece);
        }
        4 if len > 0 && max_len > 4096 => {
            // A huge field: one piece repeated up to the length bound.
            let start = rng.random_range(0..len);
            let end = (start + rng.random_range(1..=8.min(len - start))).min(len);
            let piece = data[start..end].to_vec();
            let times = rng.random_range(1..=(max_len / 2 / piece.len()).max(1));
            let repeated: Vec<u8> = piece
                .iter()
                .copied()
                .cycle()
                .take(piece.len() * times)
                .collect();
            let to = at(rng);
            data.splice(to..to, repeated);
        }
        5 => replace_number(rng, data),
        6 if !other.is_empty() => {
            // Splice: this input's head, the other's tail.
            let head = at(rng);
            let tail = rng.random_range(0..other.len());
            data.truncate(head);
            data.extend_from_slice(&other[tail..]);
        }
        7 if len > 0 => data.truncate(rng.random_range(0..len)),
        8 => {
            let to = at(rng);
            let count = rng.random_range(1..=8);
            let bytes: Vec<u8> = (0..count).map(|_| rng.random()).collect();
            data.splice(to..to, bytes);
        }
        _ if !dictionary.is_empty() => {
            let token = dictionary[rng.random_range(0..dictionary.len())];
            let to = at(rng);
            data.splice(to..to, token.iter().copied());
        }
        _ => data.push(rng.random()),
    }
}

/// Replaces a run of digits with an interesting number (or inserts one).
fn replace_number(rng: &mut StdRng, data: &mut Vec<u8>) {
    let number = INTERESTING_NUMBERS[rng.random_range(0..INTERESTING_NUMBERS.len())].as_bytes();
    let digits: Vec<usize> = (0..data.len())
        .filter(|&i| data[i].is_ascii_digit())
        .collect();
    if digits.is_empty() {
        let to = rng.random_range(0..=data.len());
        data.splice(to..to, number.iter().copied());
        return;
    }
    let start = digits[rng.random_range(0..digits.len())];
    let mut end = start;
    while end < data.len() && (data[end].is_ascii_digit() || data[end] == b'.') {
        end += 1;
    }
    data.splice(start..end, number.iter().copied());
}
