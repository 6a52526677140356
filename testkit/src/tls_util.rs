//! Keys and certificates for the TLS tests, made with openssl: a CA and a
//! server certificate it signed for 127.0.0.1 ([`make_certs`]), a
//! self-signed one for HAProxy ([`self_signed_pem`]), and the `openssl` run
//! the identity provider's keys are made with too (`jwt_util`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `openssl args` in `dir`; panics with its stderr when it fails.
pub(crate) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl must be installed (the README's test command installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// openssl's arguments for a new P-256 key, unencrypted.
const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// Writes `ca.pem`/`ca.key` (a fresh CA) and `server.crt`/`server.key` (signed
/// by it, for IP 127.0.0.1 and localhost) into `dir`.
pub fn make_certs(dir: &Path) {
    std::fs::create_dir_all(dir).expect("cert dir");
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=seatboard test CA",
    ];
    ca.extend(EC);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(dir, &ca);
    sign_server_cert(dir, "server", "IP:127.0.0.1,DNS:localhost");
}

/// Writes `<stem>.crt`/`<stem>.key` into `dir`: a certificate for `san` (an
/// openssl subjectAltName list, e.g. `DNS:db.invalid`) signed by the CA that
/// [`make_certs`] wrote there.
pub fn sign_server_cert(dir: &Path, stem: &str, san: &str) {
    let (key, csr, ext, crt) = (
        format!("{stem}.key"),
        format!("{stem}.csr"),
        format!("{stem}.cnf"),
        format!("{stem}.crt"),
    );
    let mut req = vec!["req", "-subj", "/CN=seatboard test server"];
    req.extend(EC);
    req.extend(["-keyout", &key, "-out", &csr]);
    openssl(dir, &req);
    std::fs::write(dir.join(&ext), format!("subjectAltName={san}\n")).expect("ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    );
}

/// A self-signed certificate for `localhost`/127.0.0.1, as one PEM
/// (certificate + key) in `dir`, the form HAProxy's `crt` wants.
pub fn self_signed_pem(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("cert dir");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
        ],
    );
    let mut both = std::fs::read(dir.join("cert.pem")).expect("cert");
    both.extend(std::fs::read(dir.join("key.pem")).expect("key"));
    let pem = dir.join("seatboard.pem");
    std::fs::write(&pem, both).expect("pem");
    pem
}
