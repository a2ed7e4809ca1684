//! The field names of a serde config struct, read from its `Deserialize` impl, so "unknown
//! key" errors can list the real keys and suggest the closest one without a second list to
//! keep in sync.

use serde::de::{self, Deserialize, Deserializer, Visitor};

#[derive(Debug)]
struct Fields(&'static [&'static str]);

impl std::fmt::Display for Fields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fields")
    }
}
impl std::error::Error for Fields {}
impl de::Error for Fields {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Fields(&[])
    }
}

struct Probe;

impl<'de> Deserializer<'de> for Probe {
    type Error = Fields;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Fields> {
        Err(Fields(&[]))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Fields> {
        Err(Fields(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// The keys `T` accepts.
pub fn fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    match T::deserialize(Probe) {
        Err(Fields(f)) => f,
        Ok(_) => &[],
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct C {
        alpha: u32,
        #[serde(default)]
        beta: bool,
    }

    #[test]
    fn lists_struct_fields() {
        assert_eq!(super::fields::<C>(), ["alpha", "beta"]);
    }
}
