//! `seatboard publish`: one snapshot written the way the selection API should,
//! state hash then PUBLISH (SPUBLISH in a sharded cluster), for operators and tests.

use crate::cli::PublishArgs;
use crate::clock;
use crate::publisher::write;
use crate::redis::commands::Commands;
use crate::redis::Redis;
use shards::snapshot::{json_depth, valid_course, MAX_PAYLOAD, MAX_SEAT_INFO_DEPTH};
use shards::{Reject, Snapshot};
use std::process::ExitCode;

/// Checks the flags, builds the snapshot (stamped with `ts`; without
/// `--version` it carries none, so hubs apply it by arrival order) and writes it.
pub fn run(args: PublishArgs) -> ExitCode {
    if !valid_course(&args.course) {
        crate::logging::line(&format!(
            "error: invalid value '{}' for '--course': 1-64 of [A-Za-z0-9_.-]",
            args.course
        ));
        return ExitCode::from(2);
    }
    if let Some(info) = &args.seat_info {
        let why = match serde_json::from_str::<&serde_json::value::RawValue>(info) {
            Ok(v) if !v.get().starts_with('{') => Some(format!("invalid value '{info}' for '--seat-info': not a JSON object")),
            Ok(v) if json_depth(v.get()) > MAX_SEAT_INFO_DEPTH => Some(format!(
                "invalid value for '--seat-info': nested deeper than {MAX_SEAT_INFO_DEPTH} levels, which a hub refuses"
            )),
            Ok(_) => None,
            Err(_) => Some(format!("invalid value '{info}' for '--seat-info': not a JSON object")),
        };
        if let Some(why) = why {
            crate::logging::line(&format!("error: {why}"));
            return ExitCode::from(2);
        }
    }
    let snap = Snapshot::build(
        args.course.as_str().into(),
        args.section,
        args.total,
        args.taken,
        args.seat_info.as_deref(),
        args.version,
        Some(clock::unix_ms()),
    );
    // What the hub would reject never reaches Redis (`--version` past 2^53
    // is already refused by its parser).
    if let Err(why) = snap.publishable() {
        let size = snap.to_payload().len();
        crate::logging::line(&match why {
            Reject::TooLarge => format!(
                "error: invalid value for '--seat-info': the snapshot would be {size} bytes, over the {MAX_PAYLOAD} a hub accepts"
            ),
            other => format!(
                "error: invalid value for '--seat-info': a hub would reject the snapshot ({})",
                other.label()
            ),
        });
        return ExitCode::from(2);
    }
    let t = &args.target;
    let redis = match Redis::from_flags(&t.redis) {
        Ok(r) => r,
        Err(e) => {
            crate::logging::line(&format!("error: {e}"));
            return ExitCode::from(2);
        }
    };
    let mut link = Commands::new(&redis, "publish");
    match write(&mut link, &t.channel_prefix, &t.state_prefix, &[snap]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            crate::logging::line(&format!("error: publish failed: {e}"));
            ExitCode::from(1)
        }
    }
}
