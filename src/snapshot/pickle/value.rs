//! The decoded values: stack and memo items, and the arena that holds the containers and
//! strings they point to.

use std::borrow::Cow;

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
    /// The arena: every string, bytes and container value of the pickle.
    pub(super) objects: Vec<Object<'a>>,
    /// The value `STOP` returned.
    pub(super) root: Item,
    /// The length of the pickle, which sets the expansion budget of the walk.
    pub(super) input_len_bytes: usize,
}

impl Object<'_> {
    /// The Python type's name, for error messages.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Object::Str(_) => "str",
            Object::Bytes(_) => "bytes",
            Object::List(_) => "list",
            Object::Tuple(_) => "tuple",
            Object::Dict(_) => "dict",
        }
    }
}

/// The Python type's name of `item`, for error messages.
pub(super) fn describe(item: Item, objects: &[Object<'_>]) -> &'static str {
    match item {
        Item::None => "None",
        Item::Bool(_) => "bool",
        Item::Int(_) | Item::UInt(_) => "int",
        Item::Float(_) => "float",
        Item::Object(index) => objects.get(index as usize).map_or("?", Object::kind),
    }
}

/// Pairs up a flat `key, value, key, value` list (its length is checked to be even).
pub(super) fn pairs(items: Vec<Item>) -> impl Iterator<Item = (Item, Item)> {
    let mut items = items.into_iter();
    std::iter::from_fn(move || Some((items.next()?, items.next()?)))
}
