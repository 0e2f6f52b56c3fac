//! A backend kind's settings as front ends hand them over: a kind and
//! key/value pairs, whatever the kind. The CLI's `-o KEY=VALUE`, the API's
//! JSON object and the Python client's dict all become one
//! [`BackendSettings`]; the kind's provider decodes it into its own typed
//! settings ([`BackendSettings::decode`]) and says what it takes
//! ([`SettingDoc`]). No front end names a kind's settings, so a new
//! setting or a new kind is one module's change.
//!
//! Values are lenient where people type them: a size is `268435456` or
//! `"256MiB"`, a flag `true` or `"false"`, a list one string or many (see
//! [`lenient`]).

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

/// A kind's settings for a new sandbox, untyped: what a front end was
/// given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendSettings {
    kind: String,
    values: Map<String, Value>,
}

/// Settings a kind does not take, or values it cannot use.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// A key the kind does not have.
    #[error("the {kind} backend has no setting {key:?}{}; it takes {}", elsewhere_text(elsewhere), known.join(", "))]
    UnknownKey {
        /// The kind.
        kind: String,
        /// The key given.
        key: String,
        /// The keys it has.
        known: Vec<String>,
        /// Kinds that do have the key (filled in by the client, which
        /// knows every kind).
        elsewhere: Vec<String>,
    },
    /// A value the kind cannot use, or a required key left out.
    #[error("the {kind} backend's settings: {message}")]
    Invalid {
        /// The kind.
        kind: String,
        /// Which key and what is wrong.
        message: String,
    },
    /// Not settings at all (not `KEY=VALUE`, not a JSON object).
    #[error("{message}")]
    Malformed {
        /// What is wrong and what to give instead.
        message: String,
    },
}

fn elsewhere_text(kinds: &[String]) -> String {
    match kinds {
        [] => String::new(),
        [kind] => format!(" (the {kind} backend has it)"),
        kinds => format!(" (the {} backends have it)", kinds.join(" and ")),
    }
}

/// One setting a kind takes, as help and `GET /v1/backends` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettingDoc {
    /// The key (`memory`).
    pub key: &'static str,
    /// What its value looks like (`SIZE`, `PATH`, `missing|always|never`).
    pub value: &'static str,
    /// Whether a create must give it.
    pub required: bool,
    /// What it does, with its default.
    pub help: &'static str,
    /// Other names it is accepted under (older API fields).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub aliases: &'static [&'static str],
}

impl SettingDoc {
    /// An optional setting.
    pub const fn optional(key: &'static str, value: &'static str, help: &'static str) -> Self {
        SettingDoc {
            key,
            value,
            required: false,
            help,
            aliases: &[],
        }
    }

    /// A setting every create must give.
    pub const fn required(key: &'static str, value: &'static str, help: &'static str) -> Self {
        SettingDoc {
            required: true,
            ..SettingDoc::optional(key, value, help)
        }
    }

    /// The same, also accepted as `aliases`.
    pub const fn aliases(self, aliases: &'static [&'static str]) -> Self {
        SettingDoc { aliases, ..self }
    }
}

impl BackendSettings {
    /// No settings for `kind` (its defaults).
    pub fn new(kind: impl Into<String>) -> Self {
        BackendSettings {
            kind: kind.into(),
            values: Map::new(),
        }
    }

    /// From JSON: a kind's name (`"docker"`), or an object with the kind
    /// under `type` and the settings beside it (`{"type": "docker",
    /// "image": "alpine"}`); `null` is `default_kind` with its defaults.
    pub fn from_json(value: Value, default_kind: &str) -> Result<Self, SettingsError> {
        match value {
            Value::Null => Ok(BackendSettings::new(default_kind)),
            Value::String(kind) => Ok(BackendSettings::new(kind)),
            Value::Object(mut values) => {
                let kind = match values.remove("type") {
                    None | Some(Value::Null) => default_kind.to_string(),
                    Some(Value::String(kind)) => kind,
                    Some(other) => {
                        return Err(SettingsError::Malformed {
                            message: format!("a backend's `type` is its kind's name, not {other}"),
                        })
                    }
                };
                Ok(BackendSettings { kind, values })
            }
            other => Err(SettingsError::Malformed {
                message: format!(
                    "a backend is a kind's name or an object with `type` and its settings, not {other}"
                ),
            }),
        }
    }

    /// As JSON: an object with the kind under `type` and the settings
    /// beside it (what [`BackendSettings::from_json`] reads back).
    pub fn to_json(&self) -> Value {
        let mut object = self.values.clone();
        object.insert("type".into(), Value::String(self.kind.clone()));
        Value::Object(object)
    }

    /// The kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The values given, by key.
    pub fn values(&self) -> &Map<String, Value> {
        &self.values
    }

    /// Whether nothing was given.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Sets `key`; a key given again becomes a list of every value.
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let value = value.into();
        match self.values.entry(key.into()) {
            serde_json::map::Entry::Vacant(slot) => {
                slot.insert(value);
            }
            serde_json::map::Entry::Occupied(mut slot) => match slot.get_mut() {
                Value::Array(list) => list.push(value),
                first => {
                    let first = first.take();
                    *slot.get_mut() = Value::Array(vec![first, value]);
                }
            },
        }
    }

    /// Sets a setting from `KEY=VALUE` as people type it (`-o
    /// memory=2GiB`); dashes in the key are underscores (`pids-limit` is
    /// `pids_limit`).
    pub fn add_pair(&mut self, pair: &str) -> Result<(), SettingsError> {
        let (key, value) = pair
            .split_once('=')
            .filter(|(key, _)| !key.trim().is_empty())
            .ok_or_else(|| SettingsError::Malformed {
                message: format!("{pair:?} is not KEY=VALUE (e.g. memory=2GiB)"),
            })?;
        self.add(key.trim().replace('-', "_"), value);
        Ok(())
    }

    /// Decodes the settings as the kind's own type `T`, after checking
    /// every key is one of `docs` (keys or aliases). `T` should refuse
    /// unknown fields too (`#[serde(deny_unknown_fields)]`).
    pub fn decode<T: DeserializeOwned>(&self, docs: &[SettingDoc]) -> Result<T, SettingsError> {
        let known = |key: &str| {
            docs.iter()
                .any(|d| d.key == key || d.aliases.contains(&key))
        };
        if let Some(key) = self.values.keys().find(|k| !known(k)) {
            return Err(SettingsError::UnknownKey {
                kind: self.kind.clone(),
                key: key.clone(),
                known: docs.iter().map(|d| d.key.to_string()).collect(),
                elsewhere: Vec::new(),
            });
        }
        if let Some(doc) = docs.iter().find(|d| {
            d.required
                && !d
                    .aliases
                    .iter()
                    .chain([&d.key])
                    .any(|k| self.values.contains_key(*k))
        }) {
            return Err(self.invalid(format!(
                "{} is required ({}: {})",
                doc.key, doc.value, doc.help
            )));
        }
        let value = Value::Object(self.values.clone());
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            self.invalid(if path == "." {
                inner.to_string()
            } else {
                format!("{path}: {inner}")
            })
        })
    }

    /// `bytes` (a size setting `key`) as the signed byte count engines
    /// take, or an error naming `key` when it does not fit.
    pub fn signed_bytes(&self, key: &str, bytes: u64) -> Result<i64, SettingsError> {
        i64::try_from(bytes).map_err(|_| self.invalid(format!("{key}: {bytes} bytes is too large")))
    }

    /// `n` (a number setting `key`) if it is positive and finite, or an
    /// error naming `key`.
    pub fn positive(&self, key: &str, n: f64) -> Result<f64, SettingsError> {
        if n > 0.0 && n.is_finite() {
            Ok(n)
        } else {
            Err(self.invalid(format!("{key}: {n} is not a positive number")))
        }
    }

    /// A [`SettingsError::Invalid`] of this kind: `message` says which
    /// key and what is wrong (for checks across keys after decoding).
    pub fn invalid(&self, message: impl Into<String>) -> SettingsError {
        SettingsError::Invalid {
            kind: self.kind.clone(),
            message: message.into(),
        }
    }
}

/// Deserializers for values as people type them, for a kind's settings
/// fields (`#[serde(default, deserialize_with = "lenient::size")]`).
/// Each takes the native JSON value or its text.
pub mod lenient {
    use serde::de::{Deserializer, Error};
    use serde::Deserialize;
    use serde_json::Value;
    use std::time::Duration;

    fn text_or<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
        Option::<Value>::deserialize(d)
    }

    /// A size in bytes: a number or `"256MiB"` (see
    /// [`crate::units::parse_size`]).
    pub fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match text_or(d)? {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(Some)
                .ok_or_else(|| D::Error::custom(format!("{n} is not a size in bytes"))),
            Some(Value::String(s)) => crate::units::parse_size(&s)
                .map(Some)
                .map_err(D::Error::custom),
            Some(other) => Err(D::Error::custom(format!("{other} is not a size"))),
        }
    }

    /// A number (`1.5`, `"1.5"`).
    pub fn number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        match text_or(d)? {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(Value::String(s)) => s
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| D::Error::custom(format!("{s:?} is not a number"))),
            Some(other) => Err(D::Error::custom(format!("{other} is not a number"))),
        }
    }

    /// A whole number (`64`, `"64"`).
    pub fn integer<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        match text_or(d)? {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| D::Error::custom(format!("{n} is not a whole number"))),
            Some(Value::String(s)) => s
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| D::Error::custom(format!("{s:?} is not a whole number"))),
            Some(other) => Err(D::Error::custom(format!("{other} is not a whole number"))),
        }
    }

    /// A flag: `true`/`false`, or their text (`yes`, `no`, `1`, `0` too).
    pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        match text_or(d)? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "1" => Ok(Some(true)),
                "false" | "no" | "off" | "0" => Ok(Some(false)),
                _ => Err(D::Error::custom(format!("{s:?} is not true or false"))),
            },
            Some(other) => Err(D::Error::custom(format!("{other} is not true or false"))),
        }
    }

    /// A duration: seconds as a number, or `"30s"`, `"2m"` (see
    /// [`crate::units::parse_duration`]).
    pub fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        match text_or(d)? {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .map(Some)
                .ok_or_else(|| D::Error::custom(format!("{n} is not a number of seconds"))),
            Some(Value::String(s)) => crate::units::parse_duration(&s)
                .map(Some)
                .map_err(D::Error::custom),
            Some(other) => Err(D::Error::custom(format!("{other} is not a duration"))),
        }
    }

    /// A list of strings: one string, or an array of them.
    pub fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        match text_or(d)? {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s]),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s),
                    other => Err(D::Error::custom(format!("{other} is not a string"))),
                })
                .collect(),
            Some(other) => Err(D::Error::custom(format!(
                "{other} is not a list of strings"
            ))),
        }
    }
}

/// Every name `docs` accept (keys and aliases), sorted: what
/// [`struct_fields`] of the kind's settings type should be.
pub fn documented_names(docs: &[SettingDoc]) -> Vec<&'static str> {
    let mut names: Vec<_> = docs
        .iter()
        .flat_map(|d| std::iter::once(d.key).chain(d.aliases.iter().copied()))
        .collect();
    names.sort_unstable();
    names
}

/// The field names serde derives for `T` (a struct), aliases included,
/// sorted: what a kind's settings type takes, for checking its
/// [`SettingDoc`]s against it ([`documented_names`]).
pub fn struct_fields<T: DeserializeOwned>() -> Vec<&'static str> {
    struct Fields(Vec<&'static str>);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fields read")
        }
    }
    impl std::error::Error for Stop {}
    impl serde::de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }
    impl<'de> serde::Deserializer<'de> for &mut Fields {
        type Error = Stop;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0.extend_from_slice(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields = Fields(Vec::new());
    let _ = T::deserialize(&mut fields);
    fields.0.sort_unstable();
    fields.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Example {
        image: String,
        #[serde(default, deserialize_with = "lenient::size")]
        memory: Option<u64>,
        #[serde(default, deserialize_with = "lenient::flag")]
        agent: Option<bool>,
        #[serde(default, deserialize_with = "lenient::list", alias = "constraint")]
        constraints: Vec<String>,
    }

    const DOCS: &[SettingDoc] = &[
        SettingDoc::required("image", "IMAGE", "the image"),
        SettingDoc::optional("memory", "SIZE", "memory"),
        SettingDoc::optional("agent", "BOOL", "agent"),
        SettingDoc::optional("constraints", "TEXT", "where").aliases(&["constraint"]),
    ];

    #[test]
    fn text_and_json_decode_alike() {
        let mut typed = BackendSettings::new("k");
        for pair in [
            "image=alpine",
            "memory=64MiB",
            "agent=false",
            "constraint=a",
            "constraint=b",
        ] {
            typed.add_pair(pair).unwrap();
        }
        let json = BackendSettings::from_json(
            serde_json::json!({"type": "k", "image": "alpine", "memory": 67108864,
                               "agent": false, "constraints": ["a", "b"]}),
            "local",
        )
        .unwrap();
        let want = Example {
            image: "alpine".into(),
            memory: Some(64 << 20),
            agent: Some(false),
            constraints: vec!["a".into(), "b".into()],
        };
        assert_eq!(typed.decode::<Example>(DOCS).unwrap(), want);
        assert_eq!(json.decode::<Example>(DOCS).unwrap(), want);
    }

    #[test]
    fn bad_settings_say_which_key() {
        let mut s = BackendSettings::new("k");
        s.add_pair("image=x").unwrap();
        s.add_pair("pids-limit=3").unwrap();
        let e = s.decode::<Example>(DOCS).unwrap_err();
        assert!(
            matches!(&e, SettingsError::UnknownKey { key, known, .. } if key == "pids_limit" && known.len() == 4),
            "{e}"
        );
        let mut s = BackendSettings::new("k");
        s.add_pair("image=x").unwrap();
        s.add_pair("memory=lots").unwrap();
        let e = s.decode::<Example>(DOCS).unwrap_err().to_string();
        assert!(e.contains("memory") && e.contains("\"lots\""), "{e}");
        let e = BackendSettings::new("k")
            .decode::<Example>(DOCS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("image is required"), "{e}");
        assert!(BackendSettings::new("k").add_pair("=x").is_err());
        assert!(BackendSettings::from_json(serde_json::json!(3), "local").is_err());
    }

    #[test]
    fn the_fields_of_a_struct_are_read() {
        assert_eq!(struct_fields::<Example>(), documented_names(DOCS));
        assert_eq!(
            documented_names(DOCS),
            ["agent", "constraint", "constraints", "image", "memory"]
        );
    }
}
