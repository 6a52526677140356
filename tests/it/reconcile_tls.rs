//! `seatboard reconcile --check` (PROTOCOL section 11) reading a real
//! PostgreSQL and a real MariaDB that take TCP connections over TLS only:
//! each TLS mode of the URL checks what it names (PostgreSQL's six `sslmode`
//! values in libpq's terms, MySQL's `ssl-mode`), against `--db-ca` or, without
//! it, the system roots (`SSL_CERT_FILE`); a server the mode does not trust is
//! not read (exit 3), a connection without TLS is refused by the server, and
//! a mode libpq does not have, its `sslrootcert`, or a `--db-ca` holding no
//! certificate is a usage error (exit 2).

use crate::common::*;
use crate::reconcile::check_command;
use std::path::{Path, PathBuf};
use std::process::Output;
use testkit::proc::{Mariadb, Postgres};
use testkit::tls_util::{make_certs, sign_server_cert};

const PG_QUERY: &str = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM seats WHERE updated_at >= $1";
const MY_QUERY: &str = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM sel.seats WHERE updated_at >= ?";

/// A CA with two server certificates it signed: `server` for 127.0.0.1
/// (the address the reconciler connects to), `elsewhere` for another name
/// only; and a second CA, `other/ca.pem`, that signed neither.
fn certs(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("seatboard-dbtls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    make_certs(&dir);
    sign_server_cert(&dir, "elsewhere", "DNS:db.invalid");
    make_certs(&dir.join("other"));
    dir
}

/// `--check` against `db` (the state hash of the one row's course is empty,
/// so a database read is exit 1 with one `missing` line); `ca` as `--db-ca`,
/// `system` as the system roots (`SSL_CERT_FILE`; none of the box's own roots
/// when None).
fn check(
    redis: &RedisServer,
    db: &str,
    query: &str,
    ca: Option<&Path>,
    system: Option<&Path>,
) -> Output {
    let mut cmd = check_command(redis, query, db);
    cmd.env_remove("SSL_CERT_DIR");
    if let Some(ca) = ca {
        cmd.arg("--db-ca").arg(ca);
    }
    match system {
        Some(file) => cmd.env("SSL_CERT_FILE", file),
        None => cmd.env_remove("SSL_CERT_FILE"),
    };
    cmd.output().expect("reconcile --check")
}

/// Whether `--check` read the database (exit 1, the row's section missing
/// from Redis) or could not (exit 3); anything else fails the test.
fn read(out: &Output, what: &str) -> bool {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(1) => {
            assert!(stdout.contains("\"state\":\"missing\""), "{what}: {stdout}");
            true
        }
        Some(3) => {
            assert!(!stderr.contains("S3cretPw"), "{what}: {stderr}");
            false
        }
        code => panic!("{what}: exit {code:?}\n{stdout}\n{stderr}"),
    }
}

#[test]
fn postgres_sslmode_checks_what_it_names_against_db_ca_or_the_system_roots() {
    let dir = certs("pg");
    let (ca, other) = (dir.join("ca.pem"), dir.join("other/ca.pem"));
    let pg = Postgres::start_tls(&dir);
    pg.psql(
        "CREATE TABLE seats (course text NOT NULL, section int NOT NULL, total_seats int NOT NULL,
           seats_taken int NOT NULL, version bigint, seat_info jsonb,
           updated_at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (course, section));
         CREATE ROLE reader LOGIN PASSWORD 'S3cretPw'; GRANT SELECT ON seats TO reader;
         INSERT INTO seats VALUES ('RT1', 0, 40, 5, 1, NULL);",
    );
    let redis = RedisServer::start();
    let url = |mode: &str| {
        format!(
            "postgres://reader:S3cretPw@127.0.0.1:{}/postgres?sslmode={mode}",
            pg.port
        )
    };
    let q = PG_QUERY;
    // (mode, --db-ca, system roots, read): the server's certificate names
    // 127.0.0.1 and is signed by `ca`.
    let table: [(&str, Option<&Path>, Option<&Path>, bool); 11] = [
        // The server takes no plain connection: TLS is really in use below.
        ("disable", None, None, false),
        ("allow", None, None, true),
        ("prefer", None, None, true),
        ("require", None, None, true),
        // With a root given, require checks the chain (as libpq's root.crt).
        ("require", Some(&other), None, false),
        ("verify-ca", Some(&ca), None, true),
        ("verify-ca", Some(&other), None, false),
        ("verify-full", Some(&ca), None, true),
        ("verify-full", Some(&other), None, false),
        // Without --db-ca: the system roots, and only them.
        ("verify-full", None, Some(&ca), true),
        ("verify-full", None, None, false),
    ];
    for (mode, db_ca, system, want) in table {
        let what = format!("sslmode={mode} --db-ca {db_ca:?} system {system:?}");
        assert_eq!(
            read(&check(&redis, &url(mode), q, db_ca, system), &what),
            want,
            "{what}"
        );
    }
    // A certificate for another name: verify-ca still reads, verify-full does not.
    pg.swap_cert(&dir.join("elsewhere.crt"), &dir.join("elsewhere.key"));
    for (mode, want) in [
        ("verify-ca", true),
        ("verify-full", false),
        ("require", true),
    ] {
        let what = format!("sslmode={mode}, a certificate for db.invalid");
        let db_ca = (mode != "require").then_some(ca.as_path());
        assert_eq!(
            read(&check(&redis, &url(mode), q, db_ca, None), &what),
            want,
            "{what}"
        );
    }
    // A mode libpq does not have is a usage error naming the flag.
    let out = check(&redis, &url("verify_full"), q, None, None);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sslmode verify_full") && !err.contains("S3cretPw"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mysql_ssl_mode_checks_what_it_names_against_db_ca_or_the_system_roots() {
    let dir = certs("my");
    let (ca, other) = (dir.join("ca.pem"), dir.join("other/ca.pem"));
    let m = Mariadb::start_tls(&dir);
    m.sql(
        "CREATE DATABASE sel; CREATE TABLE sel.seats (course varchar(64) NOT NULL, section int NOT NULL,
           total_seats int NOT NULL, seats_taken int NOT NULL, version bigint, seat_info json,
           updated_at datetime(6) NOT NULL, PRIMARY KEY (course, section));
         CREATE USER 'reader'@'%' IDENTIFIED BY 'S3cretPw'; GRANT SELECT ON sel.seats TO 'reader'@'%';
         INSERT INTO sel.seats VALUES ('RT1', 0, 40, 5, 1, NULL, NOW(6));",
    );
    let redis = RedisServer::start();
    let url = |mode: &str| m.url("reader", "S3cretPw", "sel") + &format!("?ssl-mode={mode}");
    let q = MY_QUERY;
    let table: [(&str, Option<&Path>, Option<&Path>, bool); 8] = [
        // require_secure_transport: a plain connection is refused.
        ("DISABLED", None, None, false),
        ("REQUIRED", None, None, true),
        ("VERIFY_CA", Some(&ca), None, true),
        ("VERIFY_CA", Some(&other), None, false),
        ("VERIFY_IDENTITY", Some(&ca), None, true),
        ("VERIFY_IDENTITY", Some(&other), None, false),
        // Without --db-ca: the system roots.
        ("VERIFY_IDENTITY", None, Some(&ca), true),
        ("VERIFY_IDENTITY", None, None, false),
    ];
    for (mode, db_ca, system, want) in table {
        let what = format!("ssl-mode={mode} --db-ca {db_ca:?} system {system:?}");
        assert_eq!(
            read(&check(&redis, &url(mode), q, db_ca, system), &what),
            want,
            "{what}"
        );
    }
    m.swap_cert(&dir.join("elsewhere.crt"), &dir.join("elsewhere.key"));
    for (mode, want) in [("VERIFY_CA", true), ("VERIFY_IDENTITY", false)] {
        let what = format!("ssl-mode={mode}, a certificate for db.invalid");
        assert_eq!(
            read(&check(&redis, &url(mode), q, Some(&ca), None), &what),
            want,
            "{what}"
        );
    }
    // A --db-ca that holds no certificate is a bad flag, whatever the mode.
    let bad = dir.join("not.pem");
    std::fs::write(&bad, "not a certificate\n").expect("write");
    let out = check(&redis, &url("DISABLED"), q, Some(&bad), None);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'--db-ca'") && !err.contains("S3cretPw"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
