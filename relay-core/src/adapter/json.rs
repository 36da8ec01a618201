//! A read-only cursor over a JSON body that remembers where it is, so every error names its field.

use serde_json::{Map, Value};

use super::error::AdapterError;

/// A value inside a request body together with its path from the root.
#[derive(Debug, Clone)]
pub(crate) struct At<'a> {
    value: &'a Value,
    path: String,
}

impl<'a> At<'a> {
    /// The whole body.
    pub(crate) fn root(value: &'a Value) -> Self {
        At {
            value,
            path: String::new(),
        }
    }

    /// The value under the cursor.
    pub(crate) fn value(&self) -> &'a Value {
        self.value
    }

    /// The member `key`; `None` when it is missing or `null` (clients send both for "not set").
    pub(crate) fn get(&self, key: &str) -> Option<At<'a>> {
        let value = self.value.get(key).filter(|v| !v.is_null())?;
        let path = if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        };
        Some(At { value, path })
    }

    /// The member `key`, which must be present.
    pub(crate) fn require(&self, key: &str) -> Result<At<'a>, AdapterError> {
        self.get(key)
            .ok_or_else(|| self.field_error(key, "is required"))
    }

    /// An error at member `key` of this value, present or not.
    pub(crate) fn field_error(&self, key: &str, message: impl Into<String>) -> AdapterError {
        let path = if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        };
        AdapterError::new(path, message)
    }

    /// The elements of an array, each with its `[i]` path.
    pub(crate) fn items(&self) -> Result<Vec<At<'a>>, AdapterError> {
        let array = self
            .value
            .as_array()
            .ok_or_else(|| self.error("expected an array"))?;
        Ok(array
            .iter()
            .enumerate()
            .map(|(i, value)| At {
                value,
                path: format!("{}[{i}]", self.path),
            })
            .collect())
    }

    /// The value as a string.
    pub(crate) fn str(&self) -> Result<&'a str, AdapterError> {
        self.value
            .as_str()
            .ok_or_else(|| self.error("expected a string"))
    }

    /// The value as a non-negative integer.
    pub(crate) fn u64(&self) -> Result<u64, AdapterError> {
        self.value
            .as_u64()
            .ok_or_else(|| self.error("expected a non-negative integer"))
    }

    /// The value as a number.
    pub(crate) fn f64(&self) -> Result<f64, AdapterError> {
        self.value
            .as_f64()
            .ok_or_else(|| self.error("expected a number"))
    }

    /// The value as a boolean.
    pub(crate) fn bool(&self) -> Result<bool, AdapterError> {
        self.value
            .as_bool()
            .ok_or_else(|| self.error("expected a boolean"))
    }

    /// The value as an object.
    pub(crate) fn object(&self) -> Result<&'a Map<String, Value>, AdapterError> {
        self.value
            .as_object()
            .ok_or_else(|| self.error("expected a JSON object"))
    }

    /// The optional string member `key`.
    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, AdapterError> {
        self.get(key).map(|v| v.str()).transpose()
    }

    /// The optional integer member `key`.
    pub(crate) fn opt_u64(&self, key: &str) -> Result<Option<u64>, AdapterError> {
        self.get(key).map(|v| v.u64()).transpose()
    }

    /// The optional number member `key`.
    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, AdapterError> {
        self.get(key).map(|v| v.f64()).transpose()
    }

    /// The optional boolean member `key`.
    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, AdapterError> {
        self.get(key).map(|v| v.bool()).transpose()
    }

    /// The `type` member, required: content blocks and items are tagged by it.
    pub(crate) fn kind(&self) -> Result<&'a str, AdapterError> {
        self.require("type")?.str()
    }

    /// An error at this position.
    pub(crate) fn error(&self, message: impl Into<String>) -> AdapterError {
        AdapterError::new(self.path.clone(), message)
    }

    /// "`<this path>.type`: `<kind>` is not supported", for content the backend cannot take.
    pub(crate) fn unsupported_type(&self, kind: &str) -> AdapterError {
        self.field_error("type", format!("{kind} is not supported"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_name_nested_fields() {
        let body = json!({"messages": [{"content": [{"type": "audio"}]}]});
        let root = At::root(&body);
        let block = &root.require("messages").unwrap().items().unwrap()[0]
            .require("content")
            .unwrap()
            .items()
            .unwrap()[0];
        assert_eq!(
            block.unsupported_type("audio").to_string(),
            "messages[0].content[0].type: audio is not supported"
        );
        assert_eq!(
            block.require("text").unwrap_err().to_string(),
            "messages[0].content[0].text: is required"
        );
    }

    #[test]
    fn null_counts_as_missing_and_wrong_types_are_named() {
        let body = json!({"a": null, "b": 3});
        let root = At::root(&body);
        assert!(root.get("a").is_none());
        assert_eq!(
            root.opt_str("b").unwrap_err().to_string(),
            "b: expected a string"
        );
        assert_eq!(
            At::root(&json!([])).object().unwrap_err().to_string(),
            "body: expected a JSON object"
        );
    }
}
