//! Small readers over parsed YAML that name the field they were reading when the input is wrong.

use serde_yaml_ng::{Mapping, Value};

/// A field held the wrong kind of value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WrongType {
    pub field: String,
    pub expected: &'static str,
}

pub(crate) fn mapping<'v>(value: &'v Value, field: &str) -> Result<&'v Mapping, WrongType> {
    match value {
        Value::Mapping(m) => Ok(m),
        _ => Err(wrong(field, "a mapping")),
    }
}

pub(crate) fn sequence<'v>(value: &'v Value, field: &str) -> Result<&'v [Value], WrongType> {
    match value {
        Value::Sequence(s) => Ok(s),
        _ => Err(wrong(field, "a list")),
    }
}

/// A mapping key, which must be a string.
pub(crate) fn key<'v>(key: &'v Value, field: &str) -> Result<&'v str, WrongType> {
    match key {
        Value::String(s) => Ok(s),
        _ => Err(wrong(field, "string keys")),
    }
}

/// A scalar written as text or as a plain number (YAML reads `1000` as a number).
pub(crate) fn scalar_text(value: &Value, field: &str) -> Result<String, WrongType> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(wrong(field, "a string or number")),
    }
}

pub(crate) fn string(value: &Value, field: &str) -> Result<String, WrongType> {
    match value {
        Value::String(s) => Ok(s.clone()),
        _ => Err(wrong(field, "a string")),
    }
}

pub(crate) fn integer(value: &Value, field: &str) -> Result<i64, WrongType> {
    value.as_i64().ok_or_else(|| wrong(field, "an integer"))
}

/// The entries of a mapping with string keys, in file order.
pub(crate) fn entries<'v>(
    value: &'v Value,
    field: &str,
) -> Result<Vec<(&'v str, &'v Value)>, WrongType> {
    mapping(value, field)?
        .iter()
        .map(|(k, v)| Ok((key(k, field)?, v)))
        .collect()
}

fn wrong(field: &str, expected: &'static str) -> WrongType {
    WrongType {
        field: field.to_string(),
        expected,
    }
}
