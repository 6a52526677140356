//! A token's claims read from its decoded payload without building a
//! `serde_json::Value` tree: only the claims the rules read are kept (their
//! strings borrowed from the payload when unescaped); every other value is
//! still parsed through the same `serde_json` deserializer and dropped, so a
//! payload is refused exactly when `Value` refuses it. Where `Value` does
//! something of its own (a first key naming `serde_json`'s raw value token), or
//! the payload is not an object, the answer is `Value`'s, parsed again.

use super::claims::{Json, Rules};
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// The key `serde_json::Value` (with its `raw_value` feature) reads as "the
/// rest is a raw value" when it comes first in an object.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// A claim's value, as much of it as the rules read.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim<'a> {
    /// A string, borrowed from the payload unless it had escapes.
    Str(Cow<'a, str>),
    /// A number, as `serde_json::Value::as_f64` gives it.
    Num(f64),
    /// An array.
    Arr(Vec<Claim<'a>>),
    /// An object's members in order, repeated keys kept; [`Json::field`] reads
    /// the last one, as `Value` keeps the last.
    Obj(Vec<(Cow<'a, str>, Claim<'a>)>),
    /// `true`, `false` or `null`.
    Other,
}

impl Json for Claim<'_> {
    fn field(&self, key: &str) -> Option<&Self> {
        match self {
            Claim::Obj(members) => members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    fn text(&self) -> Option<&str> {
        match self {
            Claim::Str(s) => Some(s),
            _ => None,
        }
    }
    fn number(&self) -> Option<f64> {
        match self {
            Claim::Num(n) => Some(*n),
            _ => None,
        }
    }
    fn items(&self) -> Option<&[Self]> {
        match self {
            Claim::Arr(a) => Some(a),
            _ => None,
        }
    }
}

/// The claims of a decoded payload that `rules` read (a [`Claim::Obj`]), or
/// `None` when the payload is not JSON or not a JSON object.
pub fn read<'a>(payload: &'a [u8], rules: &Rules) -> Option<Claim<'a>> {
    let mut de = serde_json::Deserializer::from_slice(payload);
    let fast = Top { rules }
        .deserialize(&mut de)
        .and_then(|claims| de.end().map(|()| claims));
    match fast {
        Ok(claims) => Some(claims),
        // Rare (bad JSON, not an object, the raw value key): `Value` decides.
        Err(_) => match serde_json::from_slice::<serde_json::Value>(payload) {
            Ok(tree @ serde_json::Value::Object(_)) => Some(owned(tree)),
            _ => None,
        },
    }
}

/// A whole `Value` tree as a claim.
fn owned(v: serde_json::Value) -> Claim<'static> {
    use serde_json::Value;
    match v {
        Value::String(s) => Claim::Str(Cow::Owned(s)),
        Value::Number(n) => n.as_f64().map_or(Claim::Other, Claim::Num),
        Value::Array(a) => Claim::Arr(a.into_iter().map(owned).collect()),
        Value::Object(m) => Claim::Obj(
            m.into_iter()
                .map(|(k, v)| (Cow::Owned(k), owned(v)))
                .collect(),
        ),
        Value::Bool(_) | Value::Null => Claim::Other,
    }
}

/// Which keys of an object are kept.
#[derive(Clone, Copy)]
enum Keep<'r> {
    /// Every key (an object inside a kept claim).
    All,
    /// None (an object inside a dropped claim).
    Nothing,
    /// The top-level claims the rules read.
    Wanted(&'r Rules),
}

/// One object key: `Some` when kept; an error for the raw value token first.
struct Key<'r> {
    keep: Keep<'r>,
    first: bool,
}

impl Key<'_> {
    fn kept<E: de::Error>(&self, s: &str) -> Result<bool, E> {
        if self.first && s == RAW_VALUE_TOKEN {
            return Err(E::custom("raw value key"));
        }
        Ok(match self.keep {
            Keep::All => true,
            Keep::Nothing => false,
            Keep::Wanted(rules) => rules.wants(s),
        })
    }
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = Option<Cow<'de, str>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = Option<Cow<'de, str>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(self.kept(s)?.then_some(Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(self.kept(s)?.then(|| Cow::Owned(s.to_owned())))
    }
}

/// Reads an object's members: each kept key's value as a [`Claim`], the others dropped.
fn members<'de, A: MapAccess<'de>>(
    mut map: A,
    keep: Keep<'_>,
) -> Result<Vec<(Cow<'de, str>, Claim<'de>)>, A::Error> {
    let mut kept = Vec::new();
    let mut first = true;
    while let Some(key) = map.next_key_seed(Key { keep, first })? {
        first = false;
        match key {
            Some(k) => kept.push((k, map.next_value::<Claim<'de>>()?)),
            None => map.next_value_seed(Skip)?,
        }
    }
    Ok(kept)
}

/// The top-level object: the claims `rules` read.
struct Top<'r> {
    rules: &'r Rules,
}

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = Claim<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = Claim<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of claims")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        members(map, Keep::Wanted(self.rules)).map(Claim::Obj)
    }
}

impl<'de> Deserialize<'de> for Claim<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ClaimVisitor)
    }
}

/// Builds a [`Claim`] from whatever JSON value comes.
struct ClaimVisitor;

impl<'de> Visitor<'de> for ClaimVisitor {
    type Value = Claim<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Claim::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Claim::Other)
    }
    // As `serde_json::Value::as_f64` converts each kind of number.
    #[allow(clippy::cast_precision_loss)]
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Claim::Num(n as f64))
    }
    #[allow(clippy::cast_precision_loss)]
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        Ok(Claim::Num(n as f64))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
        Ok(Claim::Num(n))
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Claim::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Claim::Str(Cow::Owned(s.to_owned())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Claim<'de>>()? {
            items.push(item);
        }
        Ok(Claim::Arr(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        members(map, Keep::All).map(Claim::Obj)
    }
}

/// Parses a value the rules do not read, keeping nothing.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // `deserialize_any`, not `deserialize_ignored_any`: the latter only
        // scans, and would let through what `Value` refuses (`1e400`, a lone
        // surrogate escape).
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        members(map, Keep::Nothing).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const NOW: f64 = 1_800_000_000.0;

    /// What the rules made of a payload parsed whole into a `Value` (the reference).
    fn by_value(payload: &str, rules: &Rules) -> Option<super::super::Identity> {
        let tree: Value = serde_json::from_str(payload).ok()?;
        if !tree.is_object() {
            return None;
        }
        rules.check(&tree, NOW)
    }

    fn by_claims(payload: &str, rules: &Rules) -> Option<super::super::Identity> {
        rules.check(&read(payload.as_bytes(), rules)?, NOW)
    }

    #[test]
    fn a_plain_payload_keeps_only_the_claims_read_borrowed() {
        let rules = Rules::new(None, Some("sb".into()), "realm.roles");
        let payload = br#"{"iss":"x","sub":"u","exp":1800000060,"aud":["sb"],"pad":"xyz","realm":{"roles":["admin"],"y":1}}"#;
        let claims = read(payload, &rules).expect("claims");
        let Claim::Obj(members) = &claims else {
            panic!("not an object: {claims:?}");
        };
        let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(keys, ["sub", "exp", "aud", "realm"], "iss and pad dropped");
        assert!(members.iter().all(|(k, _)| matches!(k, Cow::Borrowed(_))));
        assert!(
            matches!(claims.field("sub"), Some(Claim::Str(Cow::Borrowed("u")))),
            "read in one pass, borrowed from the payload: {claims:?}"
        );
        assert_eq!(claims.field("exp"), Some(&Claim::Num(1_800_000_060.0)));
        let roles = claims.field("realm").and_then(|r| r.field("roles"));
        assert_eq!(
            roles.and_then(Json::items),
            Some(&[Claim::Str(Cow::Borrowed("admin"))][..])
        );
        // Escapes: a string of its own, same text.
        let escaped = read(br#"{"s\u0075b":"\u0075","exp":1}"#, &rules).expect("claims");
        assert!(matches!(escaped.field("sub"), Some(Claim::Str(Cow::Owned(s))) if s == "u"));
    }

    #[test]
    fn not_an_object_is_none() {
        let rules = Rules::new(None, None, "role");
        for payload in [
            "[]",
            "[{\"sub\":\"u\"}]",
            "1",
            "\"x\"",
            "null",
            "true",
            "",
            "{",
            "{}x",
        ] {
            assert_eq!(read(payload.as_bytes(), &rules), None, "{payload}");
        }
        assert_eq!(read(b"{}", &rules), Some(Claim::Obj(Vec::new())));
    }

    /// Every payload built from these members (up to three, in every order)
    /// gets the same answer from the claims read as from a whole `Value` tree.
    #[test]
    fn same_answers_as_a_whole_value_tree() {
        let members = [
            r#""sub":"u""#,
            r#""sub":"""#,
            r#""sub":"admin""#,
            r#""sub":7"#,
            r#""s\u0075b":"v""#,
            r#""exp":1800000060"#,
            r#""exp":1799999960.5"#,
            r#""exp":"1800000060""#,
            r#""exp":-1"#,
            r#""nbf":1800000090"#,
            r#""nbf":null"#,
            r#""iss":"https://idp""#,
            r#""iss":["https://idp"]"#,
            r#""aud":["x","sb"]"#,
            r#""aud":"sb""#,
            r#""aud":{"sb":1}"#,
            r#""role":"admin""#,
            r#""role":["admin"]"#,
            r#""role":{"roles":"admin"}"#,
            r#""realm":{"roles":["admin"],"roles":[]}"#,
            r#""realm":{"roles":"admin"}"#,
            r#""realm":"admin""#,
            r#""x":1e400"#,
            r#""x":"\ud800""#,
            r#""x":[1,{"a":[null,true]}]"#,
            r#""$serde_json::private::RawValue":"{\"sub\":\"r\",\"exp\":1800000060}""#,
            r#""$serde_json::private::RawValue":7"#,
        ];
        let rules = [
            Rules::new(None, None, "role"),
            Rules::new(Some("https://idp".into()), Some("sb".into()), "realm.roles"),
            Rules::new(None, None, "sub"),
            Rules::new(None, None, "role.roles"),
            Rules::default(),
        ];
        let n = members.len();
        let mut compared = 0;
        let mut accepted = 0;
        for a in 0..n {
            for b in 0..=n {
                for c in 0..=n {
                    let picked: Vec<&str> = [Some(a), (b < n).then_some(b), (c < n).then_some(c)]
                        .into_iter()
                        .flatten()
                        .map(|i| members[i])
                        .collect();
                    let payload = format!("{{{}}}", picked.join(","));
                    for r in &rules {
                        let want = by_value(&payload, r);
                        accepted += usize::from(want.is_some());
                        assert_eq!(by_claims(&payload, r), want, "{payload} with {r:?}");
                        compared += 1;
                    }
                }
            }
        }
        assert!(
            compared > 100_000 && accepted > 1_000,
            "{compared} {accepted}"
        );
    }
}
