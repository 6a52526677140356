//! `seatboard token`: an HS256 token signed with `--jwt-secret`, printed on
//! stdout, for trials and load tests without an identity provider.

use clap::{Args, ValueEnum};
use std::process::ExitCode;

/// The role a minted token carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TokenRole {
    /// A student (the `/ws` feed).
    Student,
    /// An admin (also `/ws/admin`).
    Admin,
}

/// Flags of `seatboard token`.
#[derive(Args, Debug, Clone)]
pub struct TokenArgs {
    /// User id (`sub`).
    #[arg(long)]
    pub user: String,
    /// Role claim.
    #[arg(long, value_enum, default_value = "student")]
    pub role: TokenRole,
    /// Lifetime: seconds, or a number with s, m, h or d (`90s`, `30m`, `1h`, `7d`).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    pub ttl: u64,
    /// HS256 secret, at least 32 bytes (the one `serve` verifies with).
    #[arg(long, env = "SEATBOARD_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
}

/// Longest lifetime minted: a year.
const MAX_TTL_S: u64 = 366 * 86_400;

/// Seconds of a `--ttl` value.
pub fn parse_ttl(s: &str) -> Result<u64, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: use seconds or s, m, h, d (`1h`)")),
    };
    match num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)) {
        Some(t) if (1..=MAX_TTL_S).contains(&t) => Ok(t),
        _ => Err(format!("{s:?}: between 1 s and 366 d")),
    }
}

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
    use super::parse_ttl;

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
