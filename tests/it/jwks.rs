//! The university's own sign-on (contract §1, §4, §4b): tokens signed by the
//! identity provider with RS*/PS256/ES256/ES384/EdDSA, keys from a PEM file or
//! a JWKS served by a real HTTP(S) server on loopback, forgeries refused,
//! `iss`/`aud`/role claim, key rotation, the provider down or unreachable,
//! bad key sets, and `seatboard token`.

use crate::common;
use crate::jwt_util;
use crate::raw;
use crate::tls_util;

use common::*;
use jwt_util::{jwks, now, JwksServer, Key, Kind, Reply};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

mod fetch;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("seatboard-jwks-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

/// `serve` with an unreachable Redis (it serves, degraded) and `args`.
fn serve(args: &[&str]) -> Seatboard {
    let redis = format!("redis://127.0.0.1:{}", free_port());
    let mut all = vec!["serve", "--redis", &redis, "--shards", "1"];
    all.extend(args);
    Seatboard::start(&all)
}

/// The answer to an upgrade with `Authorization: Bearer <token>` (just the head).
fn upgrade(port: u16, path: &str, token: &str) -> HttpResponse {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = raw::upgrade_request(path, &format!("Authorization: Bearer {token}\r\n"));
    s.write_all(req.as_bytes()).expect("send");
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    parse_response(&buf).expect("a response head")
}

fn status(port: u16, token: &str) -> u16 {
    upgrade(port, "/ws", token).status
}

fn auth_state(port: u16) -> String {
    healthz_json(port)["auth"].as_str().unwrap_or("").to_owned()
}

fn wait_auth_ok(sb: &Seatboard) {
    wait_for(Duration::from_secs(15), || {
        (auth_state(sb.port) == "ok").then_some(())
    })
    .expect("the JWKS was fetched");
}

fn retry_after(r: &HttpResponse) -> u64 {
    let v = r.header("Retry-After").expect("Retry-After on a 503");
    let s: u64 = v.parse().expect("whole seconds");
    assert!(s >= 1, "Retry-After {s}");
    s
}

fn url(s: &JwksServer) -> String {
    format!(
        "http://127.0.0.1:{}/realms/u/protocol/openid-connect/certs",
        s.port
    )
}

#[test]
fn every_algorithm_from_a_jwks_and_the_role_from_realm_access() {
    let d = dir("algs");
    let rsa = Key::new(&d, Kind::Rsa(2048), "rsa");
    let p256 = Key::new(&d, Kind::P256, "p256");
    let p384 = Key::new(&d, Kind::P384, "p384");
    let ed = Key::new(&d, Kind::Ed25519, "ed");
    let weak = Key::new(&d, Kind::Rsa(1024), "weak");
    let server = JwksServer::start(&jwks(&[&rsa, &p256, &p384, &ed, &weak]));
    let sb = serve(&[
        "--jwks-url",
        &url(&server),
        "--jwt-role-claim",
        "realm_access.roles",
    ]);
    wait_auth_ok(&sb);
    assert_eq!(
        sb.metric("seatboard_jwks_keys"),
        4.0,
        "the 1024-bit key is not held"
    );
    assert!(sb.metric("seatboard_jwks_fetches_total{result=\"ok\"}") >= 1.0);
    for key in [&rsa, &p256, &p384, &ed] {
        for alg in key.algs() {
            let t = key.token(alg, &format!("s-{alg}"), json!({}));
            assert_eq!(status(sb.port, &t), 101, "{alg} with kid {}", key.kid);
            // Without a kid: tried against every held key of its type.
            let mut claims = json!({"sub": "nokid", "exp": now() + 600});
            claims["n"] = json!(alg);
            let t = key.sign_raw(&json!({"alg": alg}), &claims, alg);
            assert_eq!(status(sb.port, &t), 101, "{alg} without kid");
        }
    }
    let weak_token = weak.token("RS256", "w", json!({}));
    assert_ne!(
        status(sb.port, &weak_token),
        101,
        "an RSA key under 2048 bits verifies nothing"
    );
    // The role from realm_access.roles.
    let admin = ed.token(
        "EdDSA",
        "boss",
        json!({"realm_access": {"roles": ["offline_access", "admin"]}}),
    );
    let student = ed.token(
        "EdDSA",
        "kim",
        json!({"realm_access": {"roles": ["offline_access"]}}),
    );
    assert_eq!(upgrade(sb.port, "/ws/admin", &admin).status, 101);
    assert_eq!(upgrade(sb.port, "/ws/admin", &student).status, 403);
    assert_eq!(upgrade(sb.port, "/ws", &student).status, 101);
    // A token longer than the old 4 KiB cap but well within the head limit.
    let long = rsa.token(
        "RS256",
        "long",
        json!({"groups": vec!["g".repeat(40); 100]}),
    );
    assert!(long.len() > 4096 && long.len() < 7000, "{}", long.len());
    assert_eq!(status(sb.port, &long), 101);
    // Past 8 KiB the head limit answers first; never accepted.
    let huge = rsa.token("RS256", "huge", json!({"pad": "x".repeat(9000)}));
    assert!(huge.len() > 8192);
    assert_ne!(status(sb.port, &huge), 101);
}

#[test]
fn every_key_type_from_a_pem_file_and_together_with_the_secret() {
    let d = dir("pem");
    for kind in [Kind::Rsa(2048), Kind::P256, Kind::P384, Kind::Ed25519] {
        let key = Key::new(&d, kind, &format!("{kind:?}").replace(['(', ')'], ""));
        let other = Key::new(&d, kind, &format!("other{}", key.kid));
        let pem = key.public_pem.to_string_lossy().into_owned();
        let sb = serve(&["--jwt-public-key", &pem, "--jwt-secret", TEST_SECRET]);
        assert_eq!(auth_state(sb.port), "ok", "no JWKS: nothing to wait for");
        for alg in key.algs() {
            assert_eq!(
                status(sb.port, &key.token(alg, "s", json!({}))),
                101,
                "{kind:?} {alg}"
            );
            assert_eq!(
                status(sb.port, &other.token(alg, "s", json!({}))),
                401,
                "{kind:?} {alg} by a key that is not configured"
            );
        }
        let hs = seatboard::auth::mint(
            TEST_SECRET.as_bytes(),
            "h",
            shards::Role::Student,
            now() + 600,
        );
        assert_eq!(status(sb.port, &hs), 101, "HS256 beside the PEM key");
        // HMAC with the PEM text as the secret (algorithm confusion).
        let pem_text = std::fs::read(&key.public_pem).unwrap();
        let forged = seatboard::auth::mint(&pem_text, "h", shards::Role::Admin, now() + 600);
        assert_eq!(
            status(sb.port, &forged),
            401,
            "{kind:?}: HS256 keyed with the public key"
        );
    }
}

#[test]
fn a_pkcs1_rsa_public_key_file_verifies_its_tokens() {
    let d = dir("pkcs1");
    let key = Key::new(&d, Kind::Rsa(2048), "pkcs1");
    let other = Key::new(&d, Kind::Rsa(2048), "pkcs1-other");
    let pkcs1 = key.public_pkcs1_pem();
    let text = std::fs::read_to_string(&pkcs1).expect("pem");
    assert!(text.starts_with("-----BEGIN RSA PUBLIC KEY-----"), "{text}");
    let sb = serve(&["--jwt-public-key", &pkcs1.to_string_lossy()]);
    for alg in key.algs() {
        assert_eq!(
            status(sb.port, &key.token(alg, "s", json!({}))),
            101,
            "{alg}"
        );
        assert_eq!(
            status(sb.port, &other.token(alg, "s", json!({}))),
            401,
            "{alg} by another key"
        );
    }
}

#[test]
fn forgeries_are_refused() {
    let d = dir("forge");
    let rsa = Key::new(&d, Kind::Rsa(2048), "r1");
    let ec = Key::new(&d, Kind::P256, "e1");
    let never_published = Key::new(&d, Kind::Rsa(2048), "r2");
    let server = JwksServer::start(&jwks(&[&rsa, &ec]));
    let sb = serve(&[
        "--jwks-url",
        &url(&server),
        "--jwt-secret",
        TEST_SECRET,
        "--jwt-issuer",
        "https://idp.example.edu/realms/u",
        "--jwt-audience",
        "seatboard",
    ]);
    wait_auth_ok(&sb);
    let good = json!({"iss": "https://idp.example.edu/realms/u", "aud": ["account", "seatboard"]});
    assert_eq!(
        status(sb.port, &rsa.token("RS256", "ok", good.clone())),
        101
    );
    assert_eq!(status(sb.port, &ec.token("ES256", "ok", good.clone())), 101);
    let claims = |sub: &str| {
        let mut c = good.clone();
        c["sub"] = json!(sub);
        c["exp"] = json!(now() + 600);
        c
    };
    // HMAC with the public key as the secret (algorithm confusion), with a published kid.
    let pem_bytes = std::fs::read(&rsa.public_pem).unwrap();
    let jwk = rsa.jwk();
    for secret in [
        pem_bytes.clone(),
        jwk["n"].as_str().unwrap().as_bytes().to_vec(),
        jwk.to_string().into_bytes(),
    ] {
        let key = jsonwebtoken::EncodingKey::from_secret(&secret).expect("hmac key");
        for alg in [
            jsonwebtoken::Algorithm::HS256,
            jsonwebtoken::Algorithm::HS384,
        ] {
            let header = json!({"alg": format!("{alg:?}"), "kid": "r1"});
            let t = jwt_util::sign_with(&key, &header, &claims("mallory"), alg);
            assert_eq!(
                status(sb.port, &t),
                401,
                "{alg:?} with the public key as secret"
            );
        }
    }
    // A key never published, under a published kid.
    let t = never_published.sign_raw(
        &json!({"alg": "RS256", "kid": "r1"}),
        &claims("mallory"),
        "RS256",
    );
    assert_eq!(status(sb.port, &t), 401);
    // The RSA key's signature presented as another key type's algorithm.
    let t = rsa.sign_raw(
        &json!({"alg": "RS256", "kid": "e1"}),
        &claims("mallory"),
        "RS256",
    );
    assert_eq!(status(sb.port, &t), 401, "kid of an EC key, RSA signature");
    let good_rs = rsa.token("RS256", "x", good.clone());
    let mut parts: Vec<String> = good_rs.split('.').map(str::to_owned).collect();
    for alg in ["ES256", "PS256", "EdDSA", "none", "None", "RS256 "] {
        parts[0] = b64(&json!({"alg": alg, "kid": "r1"}).to_string());
        assert_eq!(
            status(sb.port, &parts.join(".")),
            401,
            "{alg} header on an RS256 signature"
        );
    }
    // alg none, with an empty signature.
    let none = format!(
        "{}.{}.",
        b64(r#"{"alg":"none","kid":"r1"}"#),
        b64(&claims("mallory").to_string())
    );
    assert_eq!(status(sb.port, &none), 401);
    // Expired (past the 30 s leeway), not yet valid.
    let mut c = claims("late");
    c["exp"] = json!(now() - 120);
    assert_eq!(
        status(
            sb.port,
            &rsa.sign_raw(&json!({"alg": "RS256", "kid": "r1"}), &c, "RS256")
        ),
        401
    );
    let mut c = claims("early");
    c["nbf"] = json!(now() + 600);
    assert_eq!(
        status(
            sb.port,
            &rsa.sign_raw(&json!({"alg": "RS256", "kid": "r1"}), &c, "RS256")
        ),
        401
    );
    // Wrong iss, wrong aud, none of them.
    let bad_iss = json!({"iss": "https://idp.example.edu/realms/other", "aud": "seatboard"});
    let bad_aud = json!({"iss": "https://idp.example.edu/realms/u", "aud": ["account"]});
    for (what, extra) in [("iss", bad_iss), ("aud", bad_aud), ("neither", json!({}))] {
        assert_eq!(
            status(sb.port, &rsa.token("RS256", "m", extra.clone())),
            401,
            "{what}"
        );
        assert_eq!(
            status(sb.port, &ec.token("ES256", "m", extra)),
            401,
            "{what}"
        );
    }
    // A kid nobody publishes: at most a 503 while the set is refetched, then 401.
    let ghost = never_published.sign_raw(
        &json!({"alg": "RS256", "kid": "ghost"}),
        &claims("g"),
        "RS256",
    );
    wait_for(Duration::from_secs(15), || {
        (status(sb.port, &ghost) == 401).then_some(())
    })
    .expect("an unpublished kid ends as a 401 once the set was fetched");
    assert!(sb.metric("seatboard_handshakes_refused_total{reason=\"unauthorized\"}") > 20.0);
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

#[test]
fn a_new_kid_is_accepted_once_published_after_one_fetch() {
    let d = dir("rotate");
    let old = Key::new(&d, Kind::Rsa(2048), "2026-11");
    let new = Key::new(&d, Kind::Rsa(2048), "2026-12");
    let server = JwksServer::start(&jwks(&[&old]));
    let sb = serve(&["--jwks-url", &url(&server)]);
    wait_auth_ok(&sb);
    assert_eq!(status(sb.port, &old.token("RS256", "a", json!({}))), 101);
    // The provider rotates: the new key is published beside the old one.
    server.publish(&jwks(&[&old, &new]));
    // No fetch in the last 10 s, so the first use of the new kid fetches at once.
    wait_for(Duration::from_secs(20), || {
        server
            .since_last()
            .filter(|d| *d > Duration::from_millis(10_200))
    })
    .expect("quiet for 10 s");
    let hits = server.hits();
    let token = new.token("RS256", "b", json!({}));
    first_use_starts_one_fetch(sb.port, &token, 101, || server.hits() - hits);
    // The old key still works until the provider stops publishing it.
    assert_eq!(status(sb.port, &old.token("RS256", "a", json!({}))), 101);
}

/// The first use of a kid the node does not hold, once a fetch may start:
/// answered 503 only while the fetch it starts runs (`Retry-After` of 1 s,
/// plus up to 2 s of jitter), then `settled` (101: the fetch brought the
/// key; 401: it succeeded without it), with one fetch in all
/// (`fetches_since`).
fn first_use_starts_one_fetch(
    port: u16,
    token: &str,
    settled: u16,
    fetches_since: impl Fn() -> u64,
) {
    let first = upgrade(port, "/ws", token);
    assert!(
        first.status == settled || first.status == 503,
        "first use: {}",
        first.status
    );
    if first.status == 503 {
        let s = retry_after(&first);
        assert!(
            s <= 3,
            "a fetch is under way: 1 s (+ up to 2 s jitter), got {s}"
        );
    }
    wait_for(Duration::from_secs(5), || {
        (status(port, token) == settled).then_some(())
    })
    .unwrap_or_else(|| panic!("never {settled} after the fetch its first use started"));
    assert_eq!(fetches_since(), 1, "one fetch, however many tries");
}

#[test]
fn while_the_provider_is_down_held_keys_work_and_a_new_kid_gets_503() {
    let d = dir("down");
    let held = Key::new(&d, Kind::P256, "held");
    let later = Key::new(&d, Kind::P256, "later");
    let server = JwksServer::start(&jwks(&[&held]));
    let sb = serve(&["--jwks-url", &url(&server)]);
    wait_auth_ok(&sb);
    server.set(Reply::Hang);
    let fresh = later.token("ES256", "b", json!({}));
    // A new kid asks for a fetch (once 10 s have passed since the last one);
    // it fails.
    wait_for(Duration::from_secs(25), || {
        let _ = status(sb.port, &fresh);
        (sb.metric("seatboard_jwks_fetches_total{result=\"error\"}") >= 1.0).then_some(())
    })
    .expect("the failed fetch is counted");
    // From then on: 503 + Retry-After (the node's fault), however often it is tried.
    for _ in 0..3 {
        let r = upgrade(sb.port, "/ws", &fresh);
        assert_eq!(r.status, 503, "never a 401 for a key the node cannot fetch");
        retry_after(&r);
    }
    assert!(sb.metric("seatboard_auth_key_unavailable_total") >= 3.0);
    // The key already held is unaffected; auth stays ok (it was fetched once).
    assert_eq!(status(sb.port, &held.token("ES256", "a", json!({}))), 101);
    assert_eq!(sb.metric("seatboard_jwks_keys"), 1.0);
    assert_eq!(auth_state(sb.port), "ok");
    // An expired token is still a 401, not a 503.
    let expired = later.sign_raw(
        &json!({"alg": "ES256", "kid": "later"}),
        &json!({"sub": "x", "exp": now() - 300}),
        "ES256",
    );
    assert_eq!(status(sb.port, &expired), 401);
    // The provider is back with the new key: accepted without a restart.
    server.publish(&jwks(&[&held, &later]));
    wait_for(Duration::from_secs(40), || {
        (status(sb.port, &fresh) == 101).then_some(())
    })
    .expect("the new key once the provider answers");
}

#[test]
fn an_unreachable_jwks_at_start_is_degraded_then_ok_without_a_restart() {
    let d = dir("late");
    let key = Key::new(&d, Kind::Ed25519, "k");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let u = format!("http://127.0.0.1:{port}/jwks");
    let sb = serve(&["--jwks-url", &u]);
    let h = healthz_json(sb.port);
    assert_eq!(h["auth"], "degraded", "{h}");
    let token = key.token("EdDSA", "s", json!({}));
    let r = upgrade(sb.port, "/ws", &token);
    assert_eq!(r.status, 503);
    retry_after(&r);
    wait_for(Duration::from_secs(10), || {
        (sb.metric("seatboard_jwks_fetches_total{result=\"error\"}") >= 1.0).then_some(())
    })
    .expect("the failed fetch is counted");
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("the same port again");
    let _server = JwksServer::start_on(listener, &jwks(&[&key]), None);
    wait_for(Duration::from_secs(40), || {
        (auth_state(sb.port) == "ok").then_some(())
    })
    .expect("auth ok once the provider answers");
    assert_eq!(status(sb.port, &token), 101);
}

#[test]
fn https_jwks_is_verified_against_jwks_ca() {
    let d = dir("tls");
    tls_util::make_certs(&d);
    let key = Key::new(&d, Kind::Rsa(2048), "k");
    let tls = jwt_util::tls_server(&d.join("server.crt"), &d.join("server.key"));
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = JwksServer::start_on(listener, &jwks(&[&key]), Some(tls));
    let u = format!("https://127.0.0.1:{}/certs", server.port);
    let ca = d.join("ca.pem").to_string_lossy().into_owned();
    let sb = serve(&["--jwks-url", &u, "--jwks-ca", &ca]);
    wait_auth_ok(&sb);
    assert_eq!(status(sb.port, &key.token("PS256", "s", json!({}))), 101);
    // The system roots do not know the test CA: the fetch fails, nothing is held.
    let untrusted = serve(&["--jwks-url", &u]);
    wait_for(Duration::from_secs(10), || {
        (untrusted.metric("seatboard_jwks_fetches_total{result=\"error\"}") >= 1.0).then_some(())
    })
    .expect("the unverified fetch fails");
    assert_eq!(auth_state(untrusted.port), "degraded");
    assert_eq!(untrusted.metric("seatboard_jwks_keys"), 0.0);
}

/// Serves a good set, then `bad`; after a fetch of it the held keys still work.
fn refused_set_keeps_held_keys(name: &str, bad: Vec<u8>) {
    let d = dir(name);
    let key = Key::new(&d, Kind::P256, "good");
    let server = JwksServer::start(&jwks(&[&key]));
    let sb = serve(&["--jwks-url", &url(&server)]);
    wait_auth_ok(&sb);
    server.set(Reply::Body(bad));
    // An unknown kid asks for a fetch once 10 s have passed since the last.
    let unknown = key.sign_raw(
        &json!({"alg": "ES256", "kid": "unknown"}),
        &json!({"sub": "u", "exp": now() + 600}),
        "ES256",
    );
    wait_for(Duration::from_secs(30), || {
        let _ = status(sb.port, &unknown);
        (sb.metric("seatboard_jwks_fetches_total{result=\"error\"}") >= 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("{name}: the refused set counts as an error"));
    assert_eq!(
        sb.metric("seatboard_jwks_keys"),
        1.0,
        "{name}: held keys stay"
    );
    assert_eq!(
        status(sb.port, &key.token("ES256", "s", json!({}))),
        101,
        "{name}"
    );
    assert_eq!(auth_state(sb.port), "ok");
}

#[test]
fn a_bad_key_set_is_refused_as_a_whole() {
    let d = dir("badkey");
    let other = Key::new(&d, Kind::Rsa(2048), "other");
    // Keys that cannot be read are skipped; a set left with none is refused.
    let mut lacking = other.jwk();
    lacking.as_object_mut().unwrap().remove("e");
    let mut x5c_only = other.jwk();
    x5c_only.as_object_mut().unwrap().remove("n");
    x5c_only["x5c"] = json!(["MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"]);
    let lacking = json!({"keys": [lacking, x5c_only]})
        .to_string()
        .into_bytes();
    let mut huge = jwks(&[&other]).into_bytes();
    huge.pop();
    huge.extend(format!(r#","pad":"{}"}}"#, "x".repeat(1 << 20)).into_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not-json", b"<html>maintenance</html>".to_vec()),
        ("over-1-mib", huge),
        ("no-usable-key", lacking),
    ];
    let runs: Vec<_> = cases
        .into_iter()
        .map(|(name, bad)| std::thread::spawn(move || refused_set_keeps_held_keys(name, bad)))
        .collect();
    for r in runs {
        r.join().expect("case passed");
    }
}

/// A JWKS document of these JWKs.
fn set_of(keys: &[serde_json::Value]) -> String {
    json!({ "keys": keys }).to_string()
}

/// Waits until the provider has had no request for over 10 s, so that no
/// fetch has started within the 10 s a new one must wait for.
fn quiet_for_10_s(server: &JwksServer) {
    wait_for(Duration::from_secs(30), || {
        server
            .since_last()
            .filter(|d| *d > Duration::from_millis(10_200))
    })
    .expect("quiet for 10 s");
}

#[test]
fn a_key_that_cannot_be_read_is_skipped_and_the_others_are_used() {
    let d = dir("skip");
    let ec = Key::new(&d, Kind::P256, "ec");
    let rsa = Key::new(&d, Kind::Rsa(2048), "rsa");
    let p384 = Key::new(&d, Kind::P384, "p384");
    // An RSA key published only as a certificate chain, one without `n`, an
    // EC key whose coordinates are P-384's under `crv: P-256`.
    let mut x5c_only = rsa.jwk();
    x5c_only.as_object_mut().unwrap().remove("n");
    x5c_only.as_object_mut().unwrap().remove("e");
    x5c_only["kid"] = json!("x5");
    x5c_only["x5c"] = json!(["MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"]);
    let mut no_n = rsa.jwk();
    no_n.as_object_mut().unwrap().remove("n");
    no_n["kid"] = json!("no-n");
    let mut wrong_size = p384.jwk();
    wrong_size["crv"] = json!("P-256");
    let server = JwksServer::start(&set_of(&[ec.jwk(), x5c_only, no_n, wrong_size, rsa.jwk()]));
    let log = d.join("serve.log");
    let redis = format!("redis://127.0.0.1:{}", free_port());
    let u = url(&server);
    let args = [
        "serve",
        "--redis",
        &redis,
        "--shards",
        "1",
        "--jwks-url",
        &u,
        "--log-level",
        "warn",
    ];
    let mut sb = Seatboard::spawn_on(free_port(), &args, &[], Some(&log));
    assert!(sb.wait_answer("/healthz", Duration::from_secs(15), |r| r.status == 200));
    wait_auth_ok(&sb);
    assert_eq!(sb.metric("seatboard_jwks_keys"), 2.0);
    assert_eq!(
        sb.metric("seatboard_jwks_fetches_total{result=\"error\"}"),
        0.0
    );
    assert!(sb.metric("seatboard_jwks_fetches_total{result=\"ok\"}") >= 1.0);
    assert_eq!(status(sb.port, &ec.token("ES256", "s", json!({}))), 101);
    assert_eq!(status(sb.port, &rsa.token("RS256", "s", json!({}))), 101);
    // A token naming a skipped key is the token's fault.
    assert_eq!(status(sb.port, &p384.token("ES384", "s", json!({}))), 401);
    let x5 = rsa.sign_raw(
        &json!({"alg": "RS256", "kid": "x5"}),
        &json!({"sub": "s", "exp": now() + 600}),
        "RS256",
    );
    assert_eq!(status(sb.port, &x5), 401);
    // Each skipped key is logged with its place and kid, once for this set.
    let skipped = |text: &str| text.matches("JWKS keys that cannot be read").count();
    let text = std::fs::read_to_string(&log).expect("log");
    assert_eq!(skipped(&text), 1, "{text}");
    for key in [
        r#"key 1 (kid "x5")"#,
        r#"key 2 (kid "no-n")"#,
        r#"key 3 (kid "p384")"#,
    ] {
        assert!(text.contains(key), "{key}: {text}");
    }
    // Fetched again (an unknown kid, once no fetch started in the last 10 s):
    // the same set, no second warning.
    quiet_for_10_s(&server);
    let hits = server.hits();
    let ghost = ec.sign_raw(
        &json!({"alg": "ES256", "kid": "ghost"}),
        &json!({"sub": "g", "exp": now() + 600}),
        "ES256",
    );
    wait_for(Duration::from_secs(10), || {
        (status(sb.port, &ghost) == 401 && server.hits() > hits).then_some(())
    })
    .expect("the unknown kid fetched the set again");
    wait_for(Duration::from_secs(5), || {
        (sb.metric("seatboard_jwks_fetches_total{result=\"ok\"}") >= 2.0).then_some(())
    })
    .expect("the second fetch counted ok");
    let text = std::fs::read_to_string(&log).expect("log");
    assert_eq!(skipped(&text), 1, "{text}");
    assert_eq!(sb.metric("seatboard_jwks_keys"), 2.0);
}

#[test]
fn an_unknown_kid_is_a_401_while_the_jwks_answers() {
    let d = dir("fresh");
    let held = Key::new(&d, Kind::P256, "held");
    let enc = Key::new(&d, Kind::P256, "enc");
    let never = Key::new(&d, Kind::P256, "never");
    let mut enc_jwk = enc.jwk();
    enc_jwk["use"] = json!("enc");
    let server = JwksServer::start(&set_of(&[held.jwk(), enc_jwk]));
    let sb = serve(&["--jwks-url", &url(&server)]);
    wait_auth_ok(&sb);
    let claims = json!({"sub": "s", "exp": now() + 600});
    let ghost = never.sign_raw(&json!({"alg": "ES256", "kid": "ghost"}), &claims, "ES256");
    // Fetched moments ago, successfully: no new fetch may start yet, and the
    // set just fetched does not hold the kid.
    assert!(
        server.since_last().expect("fetched") < Duration::from_secs(8),
        "the start took too long for this check"
    );
    assert_eq!(status(sb.port, &ghost), 401, "an unpublished kid");
    // A key published for encryption signs nothing.
    assert_eq!(status(sb.port, &enc.token("ES256", "s", json!({}))), 401);
    assert_eq!(status(sb.port, &held.token("ES256", "s", json!({}))), 101);
    assert_eq!(sb.metric("seatboard_auth_key_unavailable_total"), 0.0);
    // Once a fetch may start again, the kid starts one; answered 503 while it
    // runs at most, and 401 once it succeeded without the kid.
    quiet_for_10_s(&server);
    let hits = server.hits();
    let other = never.sign_raw(&json!({"alg": "ES256", "kid": "other"}), &claims, "ES256");
    first_use_starts_one_fetch(sb.port, &other, 401, || server.hits() - hits);
    assert_eq!(status(sb.port, &enc.token("ES256", "s", json!({}))), 401);
}

#[test]
fn fetches_are_at_least_10_s_apart_while_the_provider_fails() {
    let d = dir("spacing");
    let key = Key::new(&d, Kind::Ed25519, "k");
    let server = JwksServer::start(&jwks(&[&key]));
    server.set(Reply::Hang);
    let sb = serve(&["--jwks-url", &url(&server)]);
    // A failed fetch is retried on its own...
    wait_for(Duration::from_secs(35), || {
        (server.hits() >= 2).then_some(())
    })
    .expect("two fetches");
    // ... and a token whose key is not held asks for one too, no sooner.
    let token = key.token("EdDSA", "s", json!({}));
    wait_for(Duration::from_secs(35), || {
        assert_eq!(status(sb.port, &token), 503);
        (server.hits() >= 3).then_some(())
    })
    .expect("a third fetch");
    let times = server.hit_times();
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_millis(9_500),
            "fetches {gap:?} apart: {times:?}"
        );
    }
    assert_eq!(auth_state(sb.port), "degraded");
}

#[test]
fn token_command_round_trips_and_flags_are_checked() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        seatboard_command()
            .args(args)
            .env_remove("SEATBOARD_JWT_SECRET")
            .envs(env.iter().copied())
            .output()
            .expect("run seatboard")
    };
    let out = run(
        &[
            "token",
            "--user",
            "ada",
            "--role",
            "admin",
            "--ttl",
            "1h",
            "--jwt-secret",
            TEST_SECRET,
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let out = run(
        &["token", "--user", "kim"],
        &[("SEATBOARD_JWT_SECRET", TEST_SECRET)],
    );
    assert!(out.status.success());
    let student = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let sb = serve(&["--jwt-secret", TEST_SECRET]);
    assert_eq!(upgrade(sb.port, "/ws/admin", &token).status, 101);
    assert_eq!(upgrade(sb.port, "/ws/admin", &student).status, 403);
    assert_eq!(upgrade(sb.port, "/ws", &student).status, 101);
    // The claims: sub, role, exp an hour out.
    let claims: serde_json::Value = {
        use base64::Engine as _;
        let p = token.split('.').nth(1).unwrap();
        serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p)
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(
        (claims["sub"].as_str(), claims["role"].as_str()),
        (Some("ada"), Some("admin"))
    );
    let exp = claims["exp"].as_u64().unwrap();
    assert!(exp.abs_diff(now() + 3600) <= 5, "{exp}");
    // Exit 2 without a secret of at least 32 bytes, naming the flag.
    for args in [
        &["token", "--user", "u"][..],
        &["token", "--user", "u", "--jwt-secret", "short"],
    ] {
        let out = run(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.lines().next().unwrap_or("").contains("--jwt-secret"),
            "{err}"
        );
    }
    // serve --auth jwt with nothing to verify with: exit 2, naming all three.
    let out = run(&["serve"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for flag in ["--jwt-secret", "--jwks-url", "--jwt-public-key"] {
        assert!(err.lines().next().unwrap_or("").contains(flag), "{err}");
    }
    // Plain http only to loopback; a PEM that is not a key.
    let out = run(&["serve", "--jwks-url", "http://192.0.2.1/jwks"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--jwks-url"));
    let d = dir("flags");
    std::fs::write(
        d.join("junk.pem"),
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let junk = d.join("junk.pem").to_string_lossy().into_owned();
    let out = run(&["serve", "--jwt-public-key", &junk], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--jwt-public-key"));
}
