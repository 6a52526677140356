//! `seatboard token`: an HS256 token signed with `--jwt-secret`, printed on
//! stdout, for trials and load tests without an identity provider.

use crate::cli::{TokenArgs, TokenRole};
use std::process::ExitCode;

/// Prints the token; exit 2 without a secret of at least 32 bytes or with a bad user id.
pub fn run(args: TokenArgs) -> ExitCode {
    let Some(secret) = args.jwt_secret.as_deref().filter(|s| !s.is_empty()) else {
        return crate::logging::usage(
            "--jwt-secret (SEATBOARD_JWT_SECRET) is required: the secret `serve` verifies with",
        );
    };
    if let Err(e) = crate::auth::check_secret(secret.as_bytes()) {
        return crate::logging::usage(&e);
    }
    if args.user.is_empty() || args.user.len() > crate::auth::claims::MAX_USER {
        return crate::logging::usage("--user must be 1-256 bytes");
    }
    let role = match args.role {
        TokenRole::Student => shards::Role::Student,
        TokenRole::Admin => shards::Role::Admin,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let token = crate::auth::mint(secret.as_bytes(), &args.user, role, now + args.ttl);
    println!("{token}");
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use crate::cli::parse_ttl;

    #[test]
    fn ttl_units() {
        assert_eq!(parse_ttl("90"), Ok(90));
        assert_eq!(parse_ttl("90s"), Ok(90));
        assert_eq!(parse_ttl("30m"), Ok(1800));
        assert_eq!(parse_ttl("1h"), Ok(3600));
        assert_eq!(parse_ttl("7d"), Ok(7 * 86_400));
        for bad in [
            "",
            "0",
            "h",
            "1w",
            "-1h",
            "1.5h",
            "400d",
            "99999999999999999999",
        ] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
