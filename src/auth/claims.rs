//! What a token's claims must hold (contract §4): `sub`, `exp`/`nbf` with 30 s
//! leeway, `iss` and `aud` when configured, and the role where
//! `--jwt-role-claim` says it is.

use serde_json::Value;
use shards::Role;

/// Leeway on `exp` and `nbf`, seconds.
pub const LEEWAY_S: f64 = 30.0;

/// Longest user id accepted.
pub const MAX_USER: usize = 256;

/// The claim rules of a node.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// `iss` must equal this, when set.
    pub issuer: Option<String>,
    /// `aud` (a string or an array) must contain this, when set.
    pub audience: Option<String>,
    /// Dotted path of the role claim (`role`, `realm_access.roles`).
    pub role_path: Vec<String>,
}

impl Rules {
    /// Rules for these flags; `role_claim` is a dotted path.
    pub fn new(issuer: Option<String>, audience: Option<String>, role_claim: &str) -> Rules {
        Rules {
            issuer: issuer.filter(|s| !s.is_empty()),
            audience: audience.filter(|s| !s.is_empty()),
            role_path: role_claim.split('.').map(str::to_owned).collect(),
        }
    }

    /// Whether a top-level claim named `key` is read by these rules (the
    /// others are parsed and dropped, see [`super::payload`]).
    pub fn wants(&self, key: &str) -> bool {
        match key {
            "sub" | "exp" | "nbf" => true,
            "iss" if self.issuer.is_some() => true,
            "aud" if self.audience.is_some() => true,
            _ => self.role_path.first().is_some_and(|first| first == key),
        }
    }

    /// The identity the claims carry, or `None` (401) when one rule fails.
    pub fn check<J: Json>(&self, claims: &J, now_s: f64) -> Option<super::Identity> {
        let sub = claims.field("sub")?.text()?;
        if sub.is_empty() || sub.len() > MAX_USER {
            return None;
        }
        let exp = claims.field("exp")?.number()?;
        if exp + LEEWAY_S < now_s {
            return None;
        }
        match claims.field("nbf") {
            None => {}
            Some(nbf) if nbf.number()? > now_s + LEEWAY_S => return None,
            Some(_) => {}
        }
        if let Some(iss) = &self.issuer {
            if claims.field("iss")?.text()? != iss {
                return None;
            }
        }
        if let Some(aud) = &self.audience {
            let aud_claim = claims.field("aud")?;
            let ok = match (aud_claim.text(), aud_claim.items()) {
                (Some(s), _) => s == aud,
                (None, Some(a)) => a.iter().any(|v| v.text() == Some(aud)),
                (None, None) => false,
            };
            if !ok {
                return None;
            }
        }
        Some(super::Identity {
            user: sub.into(),
            role: self.role(claims),
        })
    }

    /// `admin` when the role claim is or contains `admin`, else `student`.
    pub fn role<J: Json>(&self, claims: &J) -> Role {
        let mut v = claims;
        for step in &self.role_path {
            match v.field(step) {
                Some(next) => v = next,
                None => return Role::Student,
            }
        }
        let admin = match (v.text(), v.items()) {
            (Some(s), _) => s == "admin",
            (None, Some(a)) => a.iter().any(|r| r.text() == Some("admin")),
            (None, None) => false,
        };
        if admin {
            Role::Admin
        } else {
            Role::Student
        }
    }
}

/// The reads the rules make of a JSON value, so they are written once for a
/// whole `serde_json::Value` tree and for the claims kept from a payload.
pub trait Json: Sized {
    /// The member `key` of an object (the last one, should the key repeat), else `None`.
    fn field(&self, key: &str) -> Option<&Self>;
    /// The string, if this is one.
    fn text(&self) -> Option<&str>;
    /// The number as `f64`, if this is one.
    fn number(&self) -> Option<f64>;
    /// The elements, if this is an array.
    fn items(&self) -> Option<&[Self]>;
}

impl Json for Value {
    fn field(&self, key: &str) -> Option<&Value> {
        self.as_object()?.get(key)
    }
    fn text(&self) -> Option<&str> {
        self.as_str()
    }
    fn number(&self) -> Option<f64> {
        self.as_f64()
    }
    fn items(&self) -> Option<&[Value]> {
        self.as_array().map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: f64 = 1_800_000_000.0;

    fn ok(r: &Rules, c: Value) -> Option<Role> {
        r.check(&c, NOW).map(|i| i.role)
    }

    #[test]
    fn issuer_and_audience() {
        let r = Rules::new(
            Some("https://idp/realms/u".into()),
            Some("seatboard".into()),
            "role",
        );
        let base = |iss: Value, aud: Value| json!({"sub":"s","exp":NOW + 60.0,"iss":iss,"aud":aud});
        assert!(ok(&r, base(json!("https://idp/realms/u"), json!("seatboard"))).is_some());
        assert!(ok(
            &r,
            base(json!("https://idp/realms/u"), json!(["x", "seatboard"]))
        )
        .is_some());
        assert!(ok(
            &r,
            base(json!("https://idp/realms/other"), json!("seatboard"))
        )
        .is_none());
        assert!(ok(&r, base(json!("https://idp/realms/u"), json!("other"))).is_none());
        assert!(ok(&r, base(json!("https://idp/realms/u"), json!(["other"]))).is_none());
        assert!(ok(
            &r,
            base(json!(["https://idp/realms/u"]), json!("seatboard"))
        )
        .is_none());
        assert!(
            ok(&r, json!({"sub":"s","exp":NOW + 60.0})).is_none(),
            "iss and aud required"
        );
        // Not configured: not checked, whatever the token carries.
        let open = Rules::new(None, None, "role");
        assert!(ok(&open, base(json!("anyone"), json!(["x"]))).is_some());
    }

    #[test]
    fn role_from_a_dotted_path_string_or_array() {
        let kc = Rules::new(None, None, "realm_access.roles");
        let t = |roles: Value| json!({"sub":"s","exp":NOW + 60.0,"realm_access":{"roles":roles}});
        assert_eq!(
            ok(&kc, t(json!(["offline_access", "admin"]))),
            Some(Role::Admin)
        );
        assert_eq!(ok(&kc, t(json!(["offline_access"]))), Some(Role::Student));
        assert_eq!(ok(&kc, t(json!("admin"))), Some(Role::Admin));
        assert_eq!(ok(&kc, t(json!(7))), Some(Role::Student));
        assert_eq!(
            ok(&kc, json!({"sub":"s","exp":NOW + 60.0})),
            Some(Role::Student)
        );
        let plain = Rules::new(None, None, "role");
        let r = |role: Value| json!({"sub":"s","exp":NOW + 60.0,"role":role});
        assert_eq!(ok(&plain, r(json!("admin"))), Some(Role::Admin));
        assert_eq!(ok(&plain, r(json!("root"))), Some(Role::Student));
        assert_eq!(ok(&plain, r(json!("Admin"))), Some(Role::Student));
    }

    #[test]
    fn a_user_id_of_1_to_256_bytes() {
        let r = Rules::default();
        let at = |sub: &str| r.check(&json!({"sub":sub,"exp":NOW + 60.0}), NOW).is_some();
        assert!(at("u") && at(&"u".repeat(MAX_USER)));
        assert!(!at("") && !at(&"u".repeat(MAX_USER + 1)));
    }

    #[test]
    fn times() {
        let r = Rules::default();
        let at = |c: Value| r.check(&c, NOW).is_some();
        assert!(at(json!({"sub":"s","exp":NOW - 10.0})));
        assert!(!at(json!({"sub":"s","exp":NOW - 31.0})));
        assert!(
            at(json!({"sub":"s","exp":NOW + 1.5})),
            "fractional NumericDate"
        );
        assert!(at(json!({"sub":"s","exp":NOW + 99.0,"nbf":NOW + 20.0})));
        assert!(!at(json!({"sub":"s","exp":NOW + 99.0,"nbf":NOW + 40.0})));
        assert!(!at(json!({"sub":"s","exp":NOW + 99.0,"nbf":"later"})));
        assert!(!at(json!({"sub":"s","exp":"soon"})));
    }
}
