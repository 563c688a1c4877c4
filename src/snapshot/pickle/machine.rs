//! A pickle reader that accepts plain data only.
//!
//! A pickle is a program for a small stack machine, and Python's `pickle.load` runs it:
//! `GLOBAL` imports any module attribute, `REDUCE` calls it. This reader runs the same
//! machine for the data opcodes of protocols 0 to 5 and refuses, at the first occurrence,
//! every opcode that would import, call, build a class instance, resolve a persistent id
//! or extension code, or build a set or buffer. Nothing is ever resolved or executed.
//!
//! Decoding happens in two passes:
//!
//! 1. [`decode`] runs the opcodes into an arena: containers live in one flat `Vec`, the
//!    stack and the memo hold small copyable [`Item`]s that point into it, and strings
//!    borrow the input. Each opcode adds at most one entry to the stack, memo, mark list
//!    or arena, so memory is linear in the input length, and every length prefix is
//!    checked against the remaining input before anything is sliced (there is nothing
//!    to allocate: string data is borrowed). Memo references share, as in Python, so a
//!    list memoized before its `APPENDS` sees the appended items.
//! 2. [`deserialize`] walks the arena as a `serde` deserializer into the typed snapshot.
//!    Shared values are copied on the way out, which can expand exponentially for a
//!    hostile file ("billion laughs" through the memo), so the walk charges every value
//!    against a budget proportional to the input length, and refuses nesting deeper than
//!    [`MAX_DEPTH`] (which also stops self-containing lists).

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Unexpected, Visitor};

use super::error::SnapshotError;

/// Deepest container nesting accepted, in levels. A PyTorch snapshot needs 6
/// (`device_traces` → trace → entry → `frames` → frame → field) and its settings 3.
pub(crate) const MAX_DEPTH: u32 = 64;

/// Expansion budget per input byte, in bytes of decoded output. The real traces use
/// 10.7 (`gpt_train.pickle`: 4.6 MB of pickle expands to 31 MB of strings and 1.2 million
/// values, because every repeated key and frame string is shared through the memo) and
/// 9.8 (`frag_churn.pickle`).
const EXPANSION_BYTES_PER_INPUT_BYTE: u64 = 64;

/// Expansion budget granted to every input however small, in bytes of decoded output.
const EXPANSION_BASE_BYTES: u64 = 16 << 20;

/// What each decoded value costs against the expansion budget, in bytes, on top of
/// the length of its string.
const VALUE_COST_BYTES: u64 = 16;

/// The most a single error message quotes from the input, in bytes.
const QUOTE_LIMIT_BYTES: usize = 200;

/// Opcodes, named as in CPython's `Lib/pickle.py`.
mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    // Protocol 2.
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    // Protocol 3.
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    // Protocol 4.
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    // Protocol 5.
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// The opcodes this reader refuses, with their `pickletools` names. Everything here
/// either reaches into Python (globals, calls, instances, persistent ids, the extension
/// registry) or builds a type that a snapshot never holds (sets, buffers).
fn forbidden_name(opcode: u8) -> Option<&'static str> {
    Some(match opcode {
        op::GLOBAL => "GLOBAL",
        op::STACK_GLOBAL => "STACK_GLOBAL",
        op::REDUCE => "REDUCE",
        op::BUILD => "BUILD",
        op::INST => "INST",
        op::OBJ => "OBJ",
        op::NEWOBJ => "NEWOBJ",
        op::NEWOBJ_EX => "NEWOBJ_EX",
        op::EXT1 => "EXT1",
        op::EXT2 => "EXT2",
        op::EXT4 => "EXT4",
        op::PERSID => "PERSID",
        op::BINPERSID => "BINPERSID",
        op::EMPTY_SET => "EMPTY_SET",
        op::ADDITEMS => "ADDITEMS",
        op::FROZENSET => "FROZENSET",
        op::BYTEARRAY8 => "BYTEARRAY8",
        op::NEXT_BUFFER => "NEXT_BUFFER",
        op::READONLY_BUFFER => "READONLY_BUFFER",
        _ => return None,
    })
}

/// One stack, memo or container slot: a scalar inline, or an index into the arena.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Item {
    None,
    Bool(bool),
    Int(i64),
    /// An integer above `i64::MAX` that fits in 64 bits.
    UInt(u64),
    Float(f64),
    /// Index into [`Decoded::objects`].
    Object(u32),
}

/// A value that lives in the arena, shared by every [`Item::Object`] that names it.
#[derive(Debug)]
pub(crate) enum Object<'a> {
    Str(Cow<'a, str>),
    Bytes(&'a [u8]),
    List(Vec<Item>),
    Tuple(Vec<Item>),
    Dict(Vec<(Item, Item)>),
}

/// The result of running a pickle: the arena and the value `STOP` returned.
#[derive(Debug)]
pub(crate) struct Decoded<'a> {
    objects: Vec<Object<'a>>,
    root: Item,
    input_len_bytes: usize,
}

/// Runs the pickle `input` (protocol 0 to 5) without resolving or calling anything.
pub(crate) fn decode(input: &[u8]) -> Result<Decoded<'_>, SnapshotError> {
    let mut machine = Machine {
        input,
        pos: 0,
        op_pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        objects: Vec::new(),
    };
    let root = machine.run()?;
    Ok(Decoded {
        objects: machine.objects,
        root,
        input_len_bytes: input.len(),
    })
}

/// The pickle virtual machine, restricted to plain data.
struct Machine<'a> {
    input: &'a [u8],
    /// Offset of the next unread byte.
    pos: usize,
    /// Offset of the opcode being run, for error messages.
    op_pos: usize,
    stack: Vec<Item>,
    /// Stack lengths at each open `MARK`; the last one is the fence below which
    /// nothing may be popped, as in CPython's unpickler.
    marks: Vec<usize>,
    memo: HashMap<u32, Item>,
    objects: Vec<Object<'a>>,
}

impl<'a> Machine<'a> {
    fn malformed<T>(&self, reason: impl Into<String>) -> Result<T, SnapshotError> {
        Err(SnapshotError::MalformedPickle {
            offset_bytes: self.op_pos,
            reason: reason.into(),
        })
    }

    fn truncated<T>(&self, needed_bytes: u64) -> Result<T, SnapshotError> {
        self.malformed(format!(
            "truncated: the opcode needs {needed_bytes} more bytes but {} remain",
            self.input.len() - self.pos
        ))
    }

    fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    /// Takes `len` bytes, checking the remaining input first, so that a huge declared
    /// length fails before anything is sliced or allocated.
    fn take(&mut self, len: u64) -> Result<&'a [u8], SnapshotError> {
        match usize::try_from(len) {
            Ok(len) if len <= self.remaining() => {
                let bytes = &self.input[self.pos..self.pos + len];
                self.pos += len;
                Ok(bytes)
            }
            _ => self.truncated(len),
        }
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let bytes = self.take(N as u64)?;
        let mut array = [0; N];
        array.copy_from_slice(bytes);
        Ok(array)
    }

    fn read_u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take_array::<1>()?[0])
    }

    fn read_u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    fn read_i32(&mut self) -> Result<i32, SnapshotError> {
        Ok(i32::from_le_bytes(self.take_array()?))
    }

    fn read_u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    /// Reads a length prefixed by a signed 32-bit integer (`BINSTRING`, `LONG4`).
    fn read_i32_len(&mut self) -> Result<u64, SnapshotError> {
        let len = self.read_i32()?;
        match u64::try_from(len) {
            Ok(len) => Ok(len),
            Err(_) => self.malformed(format!("negative length {len}")),
        }
    }

    /// Reads up to the next `\n` and returns the line without it.
    fn read_line(&mut self) -> Result<&'a [u8], SnapshotError> {
        let rest = &self.input[self.pos..];
        match rest.iter().position(|&byte| byte == b'\n') {
            Some(end) => {
                self.pos += end + 1;
                Ok(&rest[..end])
            }
            None => self.malformed("truncated: a text argument has no terminating newline"),
        }
    }

    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<Item, SnapshotError> {
        if self.stack.len() <= self.fence() {
            return self.malformed("stack underflow");
        }
        match self.stack.pop() {
            Some(item) => Ok(item),
            None => self.malformed("stack underflow"),
        }
    }

    fn top(&self) -> Result<Item, SnapshotError> {
        match self.stack.last() {
            Some(&item) if self.stack.len() > self.fence() => Ok(item),
            _ => self.malformed("stack underflow"),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<Item>, SnapshotError> {
        match self.marks.pop() {
            Some(mark) => Ok(self.stack.split_off(mark)),
            None => self.malformed("MARK not found"),
        }
    }

    fn push_object(&mut self, object: Object<'a>) -> Result<(), SnapshotError> {
        let Ok(index) = u32::try_from(self.objects.len()) else {
            return self.malformed("more than 2^32 objects");
        };
        self.objects.push(object);
        self.stack.push(Item::Object(index));
        Ok(())
    }

    fn push_str(&mut self, bytes: &'a [u8]) -> Result<(), SnapshotError> {
        match std::str::from_utf8(bytes) {
            Ok(text) => self.push_object(Object::Str(Cow::Borrowed(text))),
            Err(_) => self.malformed("string is not valid UTF-8"),
        }
    }

    fn push_int(&mut self, value: i128) -> Result<(), SnapshotError> {
        let item = if let Ok(value) = i64::try_from(value) {
            Item::Int(value)
        } else if let Ok(value) = u64::try_from(value) {
            Item::UInt(value)
        } else {
            return self.malformed(format!("integer {value} does not fit in 64 bits"));
        };
        self.stack.push(item);
        Ok(())
    }

    /// Decodes a little-endian two's-complement integer (`LONG1`, `LONG4`).
    fn push_binary_long(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        if bytes.len() > 16 {
            return self.malformed(format!(
                "{}-byte integer does not fit in 64 bits",
                bytes.len()
            ));
        }
        let negative = bytes.last().is_some_and(|&byte| byte & 0x80 != 0);
        let mut le = [if negative { 0xff } else { 0 }; 16];
        le[..bytes.len()].copy_from_slice(bytes);
        self.push_int(i128::from_le_bytes(le))
    }

    /// Parses a decimal integer written as text (`INT`, `LONG`, `PUT`, `GET`).
    fn parse_decimal(&self, line: &[u8]) -> Result<i128, SnapshotError> {
        let text = std::str::from_utf8(line).unwrap_or("").trim();
        match text.parse::<i128>() {
            Ok(value) => Ok(value),
            Err(_) => self.malformed(format!("invalid integer literal {}", quote(line))),
        }
    }

    fn parse_memo_key(&self, line: &[u8]) -> Result<u32, SnapshotError> {
        let key = self.parse_decimal(line)?;
        match u32::try_from(key) {
            Ok(key) => Ok(key),
            Err(_) => self.malformed(format!("memo key {key} out of range")),
        }
    }

    fn memo_put(&mut self, key: u32) -> Result<(), SnapshotError> {
        let item = self.top()?;
        self.memo.insert(key, item);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<(), SnapshotError> {
        match self.memo.get(&key) {
            Some(&item) => {
                self.stack.push(item);
                Ok(())
            }
            None => self.malformed(format!("memo key {key} is missing")),
        }
    }

    /// The arena object the stack top names, for `APPEND`, `SETITEM` and friends.
    fn top_object_mut(&mut self, wanted: &str) -> Result<&mut Object<'a>, SnapshotError> {
        let item = self.top()?;
        let (op_pos, found) = (self.op_pos, describe(item, &self.objects));
        if let Item::Object(index) = item {
            if let Some(object) = self.objects.get_mut(index as usize) {
                return Ok(object);
            }
        }
        Err(SnapshotError::MalformedPickle {
            offset_bytes: op_pos,
            reason: format!("expected a {wanted} on the stack, found {found}"),
        })
    }

    fn append(&mut self, items: Vec<Item>) -> Result<(), SnapshotError> {
        let op_pos = self.op_pos;
        match self.top_object_mut("list")? {
            Object::List(list) => {
                list.extend(items);
                Ok(())
            }
            other => Err(SnapshotError::MalformedPickle {
                offset_bytes: op_pos,
                reason: format!("expected a list on the stack, found {}", other.kind()),
            }),
        }
    }

    fn set_items(&mut self, items: Vec<Item>) -> Result<(), SnapshotError> {
        if !items.len().is_multiple_of(2) {
            return self.malformed("odd number of items for a dict");
        }
        let op_pos = self.op_pos;
        match self.top_object_mut("dict")? {
            Object::Dict(dict) => {
                dict.extend(pairs(items));
                Ok(())
            }
            other => Err(SnapshotError::MalformedPickle {
                offset_bytes: op_pos,
                reason: format!("expected a dict on the stack, found {}", other.kind()),
            }),
        }
    }

    /// Builds the error for a forbidden opcode, reading the global's name where the
    /// opcode carries one (it is only quoted, never looked up).
    fn forbid(&mut self, opcode: u8, name: &'static str) -> SnapshotError {
        let global = match opcode {
            op::GLOBAL | op::INST => {
                let module = self.read_line().ok();
                let attribute = self.read_line().ok();
                module
                    .zip(attribute)
                    .map(|(module, attribute)| format!("{}.{}", lossy(module), lossy(attribute)))
            }
            op::STACK_GLOBAL => {
                let len = self.stack.len();
                let text = |item: Option<&Item>| match item {
                    Some(&Item::Object(index)) => match self.objects.get(index as usize) {
                        Some(Object::Str(text)) => Some(lossy(text.as_bytes())),
                        _ => None,
                    },
                    _ => None,
                };
                let module = text(len.checked_sub(2).and_then(|i| self.stack.get(i)));
                let attribute = text(self.stack.last());
                module
                    .zip(attribute)
                    .map(|(module, attribute)| format!("{module}.{attribute}"))
            }
            _ => None,
        };
        SnapshotError::ForbiddenOpcode {
            opcode: name,
            offset_bytes: self.op_pos,
            global,
        }
    }

    fn run(&mut self) -> Result<Item, SnapshotError> {
        loop {
            self.op_pos = self.pos;
            let Some(&opcode) = self.input.get(self.pos) else {
                return self.malformed("truncated: the pickle ends without a STOP opcode");
            };
            self.pos += 1;
            if let Some(name) = forbidden_name(opcode) {
                return Err(self.forbid(opcode, name));
            }
            match opcode {
                op::PROTO => {
                    let version = self.read_u8()?;
                    if version > 5 {
                        return self.malformed(format!("unsupported pickle protocol {version}"));
                    }
                }
                op::FRAME => {
                    // Framing only groups opcodes for buffered reading; the frame must
                    // still fit in what remains, which catches most truncations early.
                    let frame_len = self.read_u64()?;
                    if frame_len > self.remaining() as u64 {
                        return self.truncated(frame_len);
                    }
                }
                op::STOP => {
                    let root = self.pop()?;
                    if self.pos != self.input.len() {
                        return self.malformed(format!(
                            "{} bytes after the STOP opcode",
                            self.input.len() - self.pos
                        ));
                    }
                    return Ok(root);
                }
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                op::POP_MARK => {
                    self.pop_mark()?;
                }
                op::DUP => {
                    let top = self.top()?;
                    self.stack.push(top);
                }

                op::NONE => self.stack.push(Item::None),
                op::NEWTRUE => self.stack.push(Item::Bool(true)),
                op::NEWFALSE => self.stack.push(Item::Bool(false)),
                op::INT => {
                    let line = self.read_line()?;
                    match line {
                        b"00" => self.stack.push(Item::Bool(false)),
                        b"01" => self.stack.push(Item::Bool(true)),
                        _ => {
                            let value = self.parse_decimal(line)?;
                            self.push_int(value)?;
                        }
                    }
                }
                op::LONG => {
                    let line = self.read_line()?;
                    let digits = line.strip_suffix(b"L").unwrap_or(line);
                    let value = self.parse_decimal(digits)?;
                    self.push_int(value)?;
                }
                op::BININT => {
                    let value = self.read_i32()?;
                    self.stack.push(Item::Int(value.into()));
                }
                op::BININT1 => {
                    let value = self.read_u8()?;
                    self.stack.push(Item::Int(value.into()));
                }
                op::BININT2 => {
                    let value = u16::from_le_bytes(self.take_array()?);
                    self.stack.push(Item::Int(value.into()));
                }
                op::LONG1 => {
                    let len = self.read_u8()?;
                    let bytes = self.take(len.into())?;
                    self.push_binary_long(bytes)?;
                }
                op::LONG4 => {
                    let len = self.read_i32_len()?;
                    let bytes = self.take(len)?;
                    self.push_binary_long(bytes)?;
                }
                op::FLOAT => {
                    let line = self.read_line()?;
                    match std::str::from_utf8(line)
                        .unwrap_or("")
                        .trim()
                        .parse::<f64>()
                    {
                        Ok(value) => self.stack.push(Item::Float(value)),
                        Err(_) => {
                            return self.malformed(format!("invalid float literal {}", quote(line)))
                        }
                    }
                }
                op::BINFLOAT => {
                    let value = f64::from_be_bytes(self.take_array()?);
                    self.stack.push(Item::Float(value));
                }

                op::STRING => {
                    let line = self.read_line()?;
                    let inner = match line {
                        [quote @ (b'\'' | b'"'), inner @ .., last] if last == quote => inner,
                        _ => return self.malformed("the STRING opcode argument must be quoted"),
                    };
                    let bytes = match unescape_string(inner) {
                        Some(bytes) => bytes,
                        None => return self.malformed("invalid escape in a STRING argument"),
                    };
                    let text = match bytes {
                        Cow::Borrowed(bytes) => std::str::from_utf8(bytes).map(Cow::Borrowed).ok(),
                        Cow::Owned(bytes) => String::from_utf8(bytes).map(Cow::Owned).ok(),
                    };
                    match text {
                        Some(text) => self.push_object(Object::Str(text))?,
                        None => return self.malformed("string is not valid UTF-8"),
                    }
                }
                op::UNICODE => {
                    let line = self.read_line()?;
                    match unescape_raw_unicode(line) {
                        Some(text) => self.push_object(Object::Str(text))?,
                        None => return self.malformed("invalid escape in a UNICODE argument"),
                    }
                }
                op::SHORT_BINSTRING | op::SHORT_BINUNICODE => {
                    let len = self.read_u8()?;
                    let bytes = self.take(len.into())?;
                    self.push_str(bytes)?;
                }
                op::BINSTRING => {
                    let len = self.read_i32_len()?;
                    let bytes = self.take(len)?;
                    self.push_str(bytes)?;
                }
                op::BINUNICODE => {
                    let len = self.read_u32()?;
                    let bytes = self.take(len.into())?;
                    self.push_str(bytes)?;
                }
                op::BINUNICODE8 => {
                    let len = self.read_u64()?;
                    let bytes = self.take(len)?;
                    self.push_str(bytes)?;
                }
                op::SHORT_BINBYTES => {
                    let len = self.read_u8()?;
                    let bytes = self.take(len.into())?;
                    self.push_object(Object::Bytes(bytes))?;
                }
                op::BINBYTES => {
                    let len = self.read_u32()?;
                    let bytes = self.take(len.into())?;
                    self.push_object(Object::Bytes(bytes))?;
                }
                op::BINBYTES8 => {
                    let len = self.read_u64()?;
                    let bytes = self.take(len)?;
                    self.push_object(Object::Bytes(bytes))?;
                }

                op::EMPTY_TUPLE => self.push_object(Object::Tuple(Vec::new()))?,
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let len = usize::from(opcode - op::TUPLE1 + 1);
                    let mut items = Vec::with_capacity(len);
                    for _ in 0..len {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push_object(Object::Tuple(items))?;
                }
                op::TUPLE => {
                    let items = self.pop_mark()?;
                    self.push_object(Object::Tuple(items))?;
                }
                op::EMPTY_LIST => self.push_object(Object::List(Vec::new()))?,
                op::LIST => {
                    let items = self.pop_mark()?;
                    self.push_object(Object::List(items))?;
                }
                op::APPEND => {
                    let item = self.pop()?;
                    self.append(vec![item])?;
                }
                op::APPENDS => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                }
                op::EMPTY_DICT => self.push_object(Object::Dict(Vec::new()))?,
                op::DICT => {
                    let items = self.pop_mark()?;
                    if !items.len().is_multiple_of(2) {
                        return self.malformed("odd number of items for a dict");
                    }
                    self.push_object(Object::Dict(pairs(items).collect()))?;
                }
                op::SETITEM => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    self.set_items(vec![key, value])?;
                }
                op::SETITEMS => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }

                op::PUT => {
                    let line = self.read_line()?;
                    let key = self.parse_memo_key(line)?;
                    self.memo_put(key)?;
                }
                op::BINPUT => {
                    let key = self.read_u8()?;
                    self.memo_put(key.into())?;
                }
                op::LONG_BINPUT => {
                    let key = self.read_u32()?;
                    self.memo_put(key)?;
                }
                op::MEMOIZE => {
                    let Ok(key) = u32::try_from(self.memo.len()) else {
                        return self.malformed("memo is full");
                    };
                    self.memo_put(key)?;
                }
                op::GET => {
                    let line = self.read_line()?;
                    let key = self.parse_memo_key(line)?;
                    self.memo_get(key)?;
                }
                op::BINGET => {
                    let key = self.read_u8()?;
                    self.memo_get(key.into())?;
                }
                op::LONG_BINGET => {
                    let key = self.read_u32()?;
                    self.memo_get(key)?;
                }

                unknown => return self.malformed(format!("unknown opcode 0x{unknown:02x}")),
            }
        }
    }
}

impl Object<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Object::Str(_) => "str",
            Object::Bytes(_) => "bytes",
            Object::List(_) => "list",
            Object::Tuple(_) => "tuple",
            Object::Dict(_) => "dict",
        }
    }
}

fn describe(item: Item, objects: &[Object<'_>]) -> &'static str {
    match item {
        Item::None => "None",
        Item::Bool(_) => "bool",
        Item::Int(_) | Item::UInt(_) => "int",
        Item::Float(_) => "float",
        Item::Object(index) => objects.get(index as usize).map_or("?", Object::kind),
    }
}

/// Pairs up a flat `key, value, key, value` list (its length is checked to be even).
fn pairs(items: Vec<Item>) -> impl Iterator<Item = (Item, Item)> {
    let mut items = items.into_iter();
    std::iter::from_fn(move || Some((items.next()?, items.next()?)))
}

fn lossy(bytes: &[u8]) -> String {
    let bytes = &bytes[..bytes.len().min(QUOTE_LIMIT_BYTES)];
    String::from_utf8_lossy(bytes).into_owned()
}

fn quote(bytes: &[u8]) -> String {
    format!("{:?}", lossy(bytes))
}

/// Undoes Python's `codecs.escape_decode` (the `STRING` opcode of protocol 0): `\\`,
/// `\'`, `\"`, `\a` `\b` `\f` `\n` `\r` `\t` `\v`, `\xHH`, octal `\OOO`, and a backslash
/// before a newline; an unknown escape stays as written, as in Python.
fn unescape_string(text: &[u8]) -> Option<Cow<'_, [u8]>> {
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
fn unescape_raw_unicode(line: &[u8]) -> Option<Cow<'_, str>> {
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

/// Walks a decoded pickle into `T` through `serde`, with the expansion budget and the
/// depth limit described in the module documentation.
pub(crate) fn deserialize<T: DeserializeOwned>(decoded: &Decoded<'_>) -> Result<T, SnapshotError> {
    let budget_bytes = EXPANSION_BASE_BYTES.saturating_add(
        (decoded.input_len_bytes as u64).saturating_mul(EXPANSION_BYTES_PER_INPUT_BYTE),
    );
    let context = Context {
        objects: &decoded.objects,
        budget_left_bytes: Cell::new(budget_bytes),
        budget_bytes,
    };
    let root = ItemDeserializer {
        context: &context,
        item: decoded.root,
        depth: 0,
    };
    T::deserialize(root).map_err(|error| match error {
        DeError::Schema { path, message } => SnapshotError::Schema {
            path: match path.strip_prefix('.') {
                Some(path) => path.to_owned(),
                None if path.is_empty() => "<root>".to_owned(),
                None => path,
            },
            message,
        },
        DeError::Limit(what) => SnapshotError::LimitExceeded { what },
    })
}

struct Context<'p, 'a> {
    objects: &'p [Object<'a>],
    budget_left_bytes: Cell<u64>,
    budget_bytes: u64,
}

impl<'p, 'a> Context<'p, 'a> {
    fn charge(&self, bytes: u64) -> Result<(), DeError> {
        match self.budget_left_bytes.get().checked_sub(bytes) {
            Some(left) => {
                self.budget_left_bytes.set(left);
                Ok(())
            }
            None => Err(DeError::Limit(format!(
                "the pickle expands to more than {} bytes of values (shared memo references \
                 are copied out; the budget is {} bytes per input byte plus {} bytes)",
                self.budget_bytes, EXPANSION_BYTES_PER_INPUT_BYTE, EXPANSION_BASE_BYTES
            ))),
        }
    }

    fn object(&self, index: u32) -> Result<&'p Object<'a>, DeError> {
        self.objects
            .get(index as usize)
            .ok_or_else(|| DeError::Limit(format!("dangling object index {index}")))
    }
}

/// Errors of the `serde` walk; turned into [`SnapshotError`] by [`deserialize`].
#[derive(Debug)]
pub(crate) enum DeError {
    /// A schema mismatch; `path` is built up from the inside out as the error unwinds.
    Schema {
        path: String,
        message: String,
    },
    Limit(String),
}

impl DeError {
    fn at(self, segment: impl fmt::Display) -> Self {
        match self {
            DeError::Schema { path, message } => DeError::Schema {
                path: format!("{segment}{path}"),
                message,
            },
            limit => limit,
        }
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeError::Schema { path, message } => write!(f, "at {path}: {message}"),
            DeError::Limit(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        DeError::Schema {
            path: String::new(),
            message: message.to_string(),
        }
    }
}

/// Deserializes one [`Item`] and, through it, everything it contains.
struct ItemDeserializer<'c, 'p, 'a> {
    context: &'c Context<'p, 'a>,
    item: Item,
    depth: u32,
}

impl ItemDeserializer<'_, '_, '_> {
    fn nested_depth(&self) -> Result<u32, DeError> {
        if self.depth >= MAX_DEPTH {
            return Err(DeError::Limit(format!(
                "containers nested deeper than {MAX_DEPTH} levels (or a container that contains itself)"
            )));
        }
        Ok(self.depth + 1)
    }
}

impl<'de> de::Deserializer<'de> for ItemDeserializer<'_, '_, '_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let context = self.context;
        context.charge(VALUE_COST_BYTES)?;
        match self.item {
            Item::None => visitor.visit_unit(),
            Item::Bool(value) => visitor.visit_bool(value),
            Item::Int(value) => visitor.visit_i64(value),
            Item::UInt(value) => visitor.visit_u64(value),
            Item::Float(value) => visitor.visit_f64(value),
            Item::Object(index) => match context.object(index)? {
                Object::Str(text) => {
                    context.charge(text.len() as u64)?;
                    visitor.visit_str(text)
                }
                Object::Bytes(bytes) => {
                    Err(de::Error::invalid_type(Unexpected::Bytes(bytes), &visitor))
                }
                Object::List(items) | Object::Tuple(items) => {
                    let depth = self.nested_depth()?;
                    let mut access = SeqAccess {
                        context,
                        items: items.iter(),
                        index: 0,
                        depth,
                    };
                    let value = visitor.visit_seq(&mut access)?;
                    // Like serde_json, refuse a sequence longer than the type takes (a
                    // 3-tuple where `segment_pool_id` wants 2).
                    match access.items.len() {
                        0 => Ok(value),
                        extra => Err(de::Error::invalid_length(
                            access.index + extra,
                            &format!("{} elements", access.index).as_str(),
                        )),
                    }
                }
                Object::Dict(entries) => {
                    let depth = self.nested_depth()?;
                    visitor.visit_map(MapAccess {
                        context,
                        entries: entries.iter(),
                        value: None,
                        depth,
                    })
                }
            },
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.item {
            Item::None => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    /// Unknown fields (`compile_context`, `external_annotations`, ...) are skipped without
    /// being walked, so they cost nothing against the budget.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct enum identifier
    }
}

struct SeqAccess<'c, 'p, 'a> {
    context: &'c Context<'p, 'a>,
    items: std::slice::Iter<'p, Item>,
    index: usize,
    depth: u32,
}

impl<'de> de::SeqAccess<'de> for SeqAccess<'_, '_, '_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        let Some(&item) = self.items.next() else {
            return Ok(None);
        };
        let index = self.index;
        self.index += 1;
        let element = ItemDeserializer {
            context: self.context,
            item,
            depth: self.depth,
        };
        seed.deserialize(element)
            .map(Some)
            .map_err(|error| error.at(format_args!("[{index}]")))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapAccess<'c, 'p, 'a> {
    context: &'c Context<'p, 'a>,
    entries: std::slice::Iter<'p, (Item, Item)>,
    /// The value of the entry whose key was just handed out, with that key for paths.
    value: Option<(&'p str, Item)>,
    depth: u32,
}

impl<'de, 'p> de::MapAccess<'de> for MapAccess<'_, 'p, '_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some(&(key, value)) = self.entries.next() else {
            return Ok(None);
        };
        let key = match key {
            Item::Object(index) => match self.context.object(index)? {
                Object::Str(text) => text.as_ref(),
                other => {
                    return Err(de::Error::custom(format!(
                        "dict key must be a str, found {}",
                        other.kind()
                    )))
                }
            },
            other => {
                let kind = describe(other, self.context.objects);
                return Err(de::Error::custom(format!(
                    "dict key must be a str, found {kind}"
                )));
            }
        };
        self.context.charge(VALUE_COST_BYTES + key.len() as u64)?;
        self.value = Some((key, value));
        seed.deserialize(IntoDeserializer::<DeError>::into_deserializer(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let Some((key, item)) = self.value.take() else {
            return Err(de::Error::custom("map value requested before its key"));
        };
        let value = ItemDeserializer {
            context: self.context,
            item,
            depth: self.depth,
        };
        seed.deserialize(value)
            .map_err(|error| error.at(format_args!(".{key}")))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}
