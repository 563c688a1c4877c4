//! The text arguments of protocol 0 (`STRING`, `UNICODE`) and the input as quoted in error
//! messages.

use std::borrow::Cow;

/// The most a single error message quotes from the input, in bytes.
const QUOTE_LIMIT_BYTES: usize = 200;

/// `bytes` as text for an error message, cut at [`QUOTE_LIMIT_BYTES`].
pub(super) fn lossy(bytes: &[u8]) -> String {
    let bytes = &bytes[..bytes.len().min(QUOTE_LIMIT_BYTES)];
    String::from_utf8_lossy(bytes).into_owned()
}

/// `bytes` quoted for an error message, cut at [`QUOTE_LIMIT_BYTES`].
pub(super) fn quote(bytes: &[u8]) -> String {
    format!("{:?}", lossy(bytes))
}

/// Undoes Python's `codecs.escape_decode` (the `STRING` opcode of protocol 0): `\\`,
/// `\'`, `\"`, `\a` `\b` `\f` `\n` `\r` `\t` `\v`, `\xHH`, octal `\OOO`, and a backslash
/// before a newline; an unknown escape stays as written, as in Python.
pub(super) fn unescape_string(text: &[u8]) -> Option<Cow<'_, [u8]>> {
    if !text.contains(&b'\\') {
        return Some(Cow::Borrowed(text));
    }
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        if byte != b'\\' {
            out.push(byte);
            continue;
        }
        let (&escape, tail) = rest.split_first()?;
        rest = tail;
        match escape {
            b'\n' => {}
            b'\\' | b'\'' | b'"' => out.push(escape),
            b'a' => out.push(0x07),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(0x0b),
            b'x' => {
                let hex = rest.get(..2)?;
                let value = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                out.push(value);
                rest = &rest[2..];
            }
            b'0'..=b'7' => {
                let mut value = u32::from(escape - b'0');
                for _ in 0..2 {
                    match rest.first() {
                        Some(&digit @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(digit - b'0');
                            rest = &rest[1..];
                        }
                        _ => break,
                    }
                }
                out.push((value & 0xff) as u8);
            }
            other => out.extend_from_slice(&[b'\\', other]),
        }
    }
    Some(Cow::Owned(out))
}

/// Undoes Python's `raw-unicode-escape` (the `UNICODE` opcode of protocol 0): bytes are
/// Latin-1 code points, and `\uXXXX` / `\UXXXXXXXX` are the only escapes.
pub(super) fn unescape_raw_unicode(line: &[u8]) -> Option<Cow<'_, str>> {
    if line.is_ascii() && !line.contains(&b'\\') {
        return std::str::from_utf8(line).ok().map(Cow::Borrowed);
    }
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        let digits = match (byte, rest.first()) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => {
                out.push(char::from(byte));
                continue;
            }
        };
        let hex = rest.get(1..1 + digits)?;
        let value = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
        out.push(char::from_u32(value)?);
        rest = &rest[1 + digits..];
    }
    Some(Cow::Owned(out))
}
