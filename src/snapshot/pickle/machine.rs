//! The first pass: the pickle machine, run over the data opcodes into an arena.

use std::borrow::Cow;
use std::collections::HashMap;

use super::opcodes::{self as op, forbidden_name};
use super::text::{lossy, quote, unescape_raw_unicode, unescape_string};
use super::value::{describe, pairs, Decoded, Item, Object};
use crate::snapshot::SnapshotError;

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

    /// Runs opcodes from the start of the input until `STOP`, and returns the value it pops.
    /// Each family of opcodes is run by one method; the first that knows the opcode runs it.
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
            if opcode == op::STOP {
                return self.stop();
            }
            let known = self.run_stack(opcode)?
                || self.run_scalar(opcode)?
                || self.run_string(opcode)?
                || self.run_container(opcode)?
                || self.run_memo(opcode)?;
            if !known {
                return self.malformed(format!("unknown opcode 0x{opcode:02x}"));
            }
        }
    }

    /// `STOP`: pops the pickle's value, which must end the input.
    fn stop(&mut self) -> Result<Item, SnapshotError> {
        let root = self.pop()?;
        if self.pos != self.input.len() {
            return self.malformed(format!(
                "{} bytes after the STOP opcode",
                self.input.len() - self.pos
            ));
        }
        Ok(root)
    }

    /// The protocol, framing, mark and stack opcodes (`PROTO`, `FRAME`, `MARK`, `POP`, `DUP`).
    /// Runs one of them and returns true, or returns false for any other opcode.
    fn run_stack(&mut self, opcode: u8) -> Result<bool, SnapshotError> {
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
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The opcodes that push `None`, a bool, an integer or a float.
    /// Runs one of them and returns true, or returns false for any other opcode.
    fn run_scalar(&mut self, opcode: u8) -> Result<bool, SnapshotError> {
        match opcode {
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
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The opcodes that push a string or bytes.
    /// Runs one of them and returns true, or returns false for any other opcode.
    fn run_string(&mut self, opcode: u8) -> Result<bool, SnapshotError> {
        match opcode {
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
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The opcodes that build tuples, lists and dicts.
    /// Runs one of them and returns true, or returns false for any other opcode.
    fn run_container(&mut self, opcode: u8) -> Result<bool, SnapshotError> {
        match opcode {
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
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The memo opcodes (`PUT`, `GET` and their binary forms, `MEMOIZE`).
    /// Runs one of them and returns true, or returns false for any other opcode.
    fn run_memo(&mut self, opcode: u8) -> Result<bool, SnapshotError> {
        match opcode {
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
            _ => return Ok(false),
        }
        Ok(true)
    }
}
