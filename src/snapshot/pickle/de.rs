//! The second pass: the decoded arena walked as a `serde` deserializer into the typed
//! snapshot, under an expansion budget and a depth limit.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Unexpected, Visitor};

use super::value::{describe, Decoded, Item, Object};
use crate::snapshot::SnapshotError;

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
