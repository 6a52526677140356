//! `seatboard --version` names the release and the commit it was built from,
//! and a build outside a git checkout still builds and says `unknown`.

use crate::common;
use common::*;
use std::path::Path;
use std::process::Command;

fn head_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn version_names_the_release_and_the_commit() {
    let out = Command::new(bin()).arg("--version").output().expect("run");
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let commit = head_commit().unwrap_or_else(|| "unknown".into());
    assert_eq!(
        line,
        format!("seatboard {} ({commit})", env!("CARGO_PKG_VERSION"))
    );
    // The subcommands say the same, under their own name.
    let sub = Command::new(bin())
        .args(["serve", "--version"])
        .output()
        .expect("run");
    let want = line.replacen("seatboard", "seatboard-serve", 1);
    assert_eq!(String::from_utf8_lossy(&sub.stdout).trim(), want);
}

#[test]
fn a_build_outside_git_says_unknown() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("seatboard-nogit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let script = dir.join("build-script");
    let built = Command::new("rustc")
        .args(["--edition", "2021", "-o"])
        .arg(&script)
        .arg(root.join("build.rs"))
        .status()
        .expect("rustc");
    assert!(built.success(), "build.rs does not compile on its own");
    // As cargo runs it from an unpacked tarball: no .git above, git may even be absent.
    let out = Command::new(&script)
        .current_dir(&dir)
        .env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap_or(&dir))
        .env_remove("GIT_DIR")
        .output()
        .expect("run build script");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l == "cargo:rustc-env=SEATBOARD_COMMIT=unknown"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
