//! YAML straight into typed objects, reading every value as the one-pass reader does.
//!
//! The one-pass reader (`files/mod.rs`) reads each document into JSON values first (`yaml_serde`
//! resolving every scalar: a plain `80` is a number, `true` a boolean, `~` null) and decodes the
//! type from those values, so a plain `80` where a string is due is an error, and so is a quoted
//! `"80"` where a number is due. Decoding with `yaml_serde` straight into the type would take
//! both (it hands any scalar to a string field as text, and `"80"` to a number field after
//! parsing it). `Strict` wraps the `yaml_serde` deserializer so that every request is answered
//! as `serde_json::Value`'s deserializer would answer it for the value the reader would have
//! built: each value is read with `deserialize_any` (the scalar resolved as for the JSON value)
//! and handed to the type only when the JSON value's deserializer would hand it over for that
//! request (a string for `deserialize_str`, a number for `deserialize_u16`, ...); map keys are
//! read as strings, as `serde_json` reads them. Parts of a document the type ignores are read
//! into a JSON value and dropped, as the reader builds them too.
//!
//! Where the two could differ, `Strict` errs (the caller then leaves the document to the
//! reader): enums, 128-bit integers, infinite or NaN floats (a JSON number cannot hold them: the
//! reader has null there), and map keys requested as anything but strings.
//!
//! Written by hand: no crate adapts one deserializer's scalar typing to another's; it is a
//! forwarding layer with no parsing of its own.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{
    self, DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Unexpected, Visitor,
};
use serde::Deserialize;

/// `documents::decode_typed` with `yaml_serde` alone.
pub(super) fn with_yaml_serde<T: de::DeserializeOwned>(text: &str) -> Option<T> {
    T::deserialize(Strict(yaml_serde::Deserializer::from_str(text))).ok()
}

/// What `serde_json::Value`'s deserializer accepts for a request, by the kind of the value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Want {
    /// `deserialize_any`: everything.
    Any,
    Bool,
    Number,
    /// Strings (also `char` and identifiers).
    Str,
    /// Null.
    Unit,
    Seq,
    Map,
    /// A struct: a map or a sequence.
    Struct,
    /// Bytes: a string or a sequence.
    Bytes,
}

/// A deserializer answering as `serde_json::Value`'s would (see the module docs).
pub(super) struct Strict<D>(pub D);

macro_rules! through_any {
    ($($method:ident => $want:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_any(Wrap { visitor, want: Want::$want })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    through_any! {
        deserialize_any => Any,
        deserialize_bool => Bool,
        deserialize_i8 => Number,
        deserialize_i16 => Number,
        deserialize_i32 => Number,
        deserialize_i64 => Number,
        deserialize_u8 => Number,
        deserialize_u16 => Number,
        deserialize_u32 => Number,
        deserialize_u64 => Number,
        deserialize_f32 => Number,
        deserialize_f64 => Number,
        deserialize_char => Str,
        deserialize_str => Str,
        deserialize_string => Str,
        deserialize_identifier => Str,
        deserialize_bytes => Bytes,
        deserialize_byte_buf => Bytes,
        deserialize_unit => Unit,
        deserialize_seq => Seq,
        deserialize_map => Map,
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(Wrap {
            visitor,
            want: Want::Struct,
        })
    }

    /// `yaml_serde` calls null exactly what its `deserialize_any` reads as null (the reader's
    /// JSON null): `None`; anything else is `Some` of the value, read strictly.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_option(OptionWrap(visitor))
    }

    /// As the JSON value: the newtype's visitor gets the value itself.
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, D::Error> {
        Err(D::Error::custom("enums are left to the one-pass reader"))
    }

    /// The reader builds a JSON value of every part of the document, used or not (and fails on
    /// what a JSON value cannot hold): so does this.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        serde_json::Value::deserialize(self.0)?;
        visitor.visit_unit()
    }
}

/// Hands a value to `visitor` when `want` takes its kind.
struct Wrap<V> {
    visitor: V,
    want: Want,
}

impl<V> Wrap<V> {
    fn takes(&self, kinds: &[Want]) -> bool {
        self.want == Want::Any || kinds.contains(&self.want)
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        if !self.takes(&[Want::Bool]) {
            return Err(E::invalid_type(Unexpected::Bool(v), &self.visitor));
        }
        self.visitor.visit_bool(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        if !self.takes(&[Want::Number]) {
            return Err(E::invalid_type(Unexpected::Signed(v), &self.visitor));
        }
        self.visitor.visit_i64(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        if !self.takes(&[Want::Number]) {
            return Err(E::invalid_type(Unexpected::Unsigned(v), &self.visitor));
        }
        self.visitor.visit_u64(v)
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<V::Value, E> {
        Err(E::custom(
            "128-bit integers are left to the one-pass reader",
        ))
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<V::Value, E> {
        Err(E::custom(
            "128-bit integers are left to the one-pass reader",
        ))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        if !v.is_finite() {
            // A JSON number cannot hold it: the reader has null there.
            return Err(E::custom("infinite or NaN: left to the one-pass reader"));
        }
        if !self.takes(&[Want::Number]) {
            return Err(E::invalid_type(Unexpected::Float(v), &self.visitor));
        }
        self.visitor.visit_f64(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        if !self.takes(&[Want::Str, Want::Bytes]) {
            return Err(E::invalid_type(Unexpected::Str(v), &self.visitor));
        }
        self.visitor.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        if !self.takes(&[Want::Str, Want::Bytes]) {
            return Err(E::invalid_type(Unexpected::Str(v), &self.visitor));
        }
        self.visitor.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        if !self.takes(&[Want::Str, Want::Bytes]) {
            return Err(E::invalid_type(Unexpected::Str(&v), &self.visitor));
        }
        self.visitor.visit_string(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        if !self.takes(&[Want::Unit]) {
            return Err(E::invalid_type(Unexpected::Unit, &self.visitor));
        }
        self.visitor.visit_unit()
    }

    /// An empty document: the reader's JSON null.
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        if !self.takes(&[Want::Seq, Want::Struct, Want::Bytes]) {
            return Err(A::Error::invalid_type(Unexpected::Seq, &self.visitor));
        }
        self.visitor.visit_seq(StrictSeq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        if !self.takes(&[Want::Map, Want::Struct]) {
            return Err(A::Error::invalid_type(Unexpected::Map, &self.visitor));
        }
        self.visitor.visit_map(StrictMap(map))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<V::Value, A::Error> {
        // A tagged node (`!Thing x`): the reader cannot build a JSON value of it either.
        Err(A::Error::custom(
            "tagged values are left to the one-pass reader",
        ))
    }
}

/// `deserialize_option`'s visitor: `Some` values are read strictly.
struct OptionWrap<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for OptionWrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(Strict(d))
    }
}

struct StrictSeq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for StrictSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct StrictMap<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for StrictMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(KeySeed(seed))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct StrictSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for StrictSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Strict(d))
    }
}

/// A map key: read as a string (as `serde_json` reads keys into a JSON object), then handed to
/// the key's type as a string.
struct KeySeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        d.deserialize_str(KeyVisitor(self.0))
    }
}

struct KeyVisitor<S>(S);

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for KeyVisitor<S> {
    type Value = S::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<S::Value, E> {
        self.0.deserialize(KeyStr(v, PhantomData))
    }
}

/// A map key's text, for the key's type: strings only (a key read as anything else errs and
/// the reader decides).
struct KeyStr<'a, E>(&'a str, PhantomData<E>);

impl<'de, E: de::Error> Deserializer<'de> for KeyStr<'_, E> {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        visitor.visit_str(self.0)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, E> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct enum identifier
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::de::DeserializeOwned;
    use serde_json::Value;

    use super::super::documents::decode_typed as from_str;
    use super::*;

    /// What the one-pass reader makes of `text` as a `T` (through JSON values).
    fn reader<T: DeserializeOwned>(text: &str) -> Option<T> {
        let v: Value = yaml_serde::from_str(text).ok()?;
        serde_json::from_value(v).ok()
    }

    /// `Strict` takes `text` exactly when the reader does, with the same value; or declines.
    fn same<T: DeserializeOwned + PartialEq + fmt::Debug>(text: &str, declines_ok: bool) {
        let strict = from_str::<T>(text);
        let slow = reader::<T>(text);
        if declines_ok && strict.is_none() {
            return;
        }
        assert_eq!(strict, slow, "{text}");
    }

    #[derive(Deserialize, PartialEq, Debug)]
    struct S {
        s: Option<String>,
        n: Option<u16>,
        b: Option<bool>,
        m: Option<BTreeMap<String, String>>,
        l: Option<Vec<String>>,
    }

    #[test]
    fn reads_scalars_as_json_values_do() {
        for t in [
            "s: 80\n",
            "s: true\n",
            "s: 1.5\n",
            "s: null\n",
            "s: ~\n",
            "s:\n",
            "s: \"80\"\n",
            "s: '80'\n",
            "s: yes\n",
            "s: 0x50\n",
            "s: [a]\n",
            "s: {a: b}\n",
            "n: 80\n",
            "n: \"80\"\n",
            "n: 80.0\n",
            "n: 0x50\n",
            "n: 1_000\n",
            "n: 70000\n",
            "n: -1\n",
            "n: true\n",
            "n: ~\n",
            "b: true\n",
            "b: yes\n",
            "b: \"true\"\n",
            "b: 1\n",
            "m: {a: b, c: 1}\n",
            "m: {a: b, c: \"1\"}\n",
            "m: {1: a, true: b, null: c}\n",
            "m: {a: null}\n",
            "l: [a, 1, true]\n",
            "l: [a, '1']\n",
            "l: a\n",
            "x: 1\ns: a\n",
            "x: {y: [1, .inf]}\ns: a\n",
            "s: &a x\nl: [*a]\n",
            "s: !!str 80\n",
            "n: !!int \"80\"\n",
        ] {
            same::<S>(t, false);
        }
        // Where the two could differ, Strict declines.
        // (A duplicate key: serde's derived structs refuse it, k8s-openapi's take the last.)
        for t in [
            "n: .inf\n",
            "s: !thing x\n",
            "x: !thing x\n",
            "n: 99999999999999999999999\n",
            "s: a\ns: b\n",
        ] {
            same::<S>(t, true);
        }
        assert_eq!(from_str::<S>("s: 80\n"), None);
        assert_eq!(from_str::<S>("n: \"80\"\n"), None);
        assert_eq!(
            from_str::<S>("s: \"80\"\nn: 80\nb: false\n"),
            Some(S {
                s: Some("80".into()),
                n: Some(80),
                b: Some(false),
                m: None,
                l: None
            })
        );
    }
}
