//! Reading a session's stream back with `XRANGE` and `XREVRANGE`, page by
//! page, for `seatboard analytics report` and the history cache behind
//! `/api/history`.

use super::{Entry, FIELDS};
use crate::redis::commands::Commands;
use crate::redis::Error;
use redis::streams::StreamRangeReply;

/// Entries per XRANGE page.
pub const PAGE: usize = 1000;

/// One read of a stream: the parsed entries (id, entry), oldest first, and the
/// last raw id read (even if that entry did not parse, so paging moves on).
pub type Page = (Vec<(String, Entry)>, Option<String>);

fn entries(reply: StreamRangeReply) -> Vec<(String, Entry)> {
    reply
        .ids
        .into_iter()
        .filter_map(|sid| {
            let [start, length, courses] = FIELDS.map(|f| sid.get::<String>(f));
            let e = Entry::from_fields(&start?, &length?, &courses?)?;
            Some((sid.id, e))
        })
        .collect()
}

/// Up to `count` entries after stream id `after` (exclusive; `None`: from the start), oldest first.
pub fn read_after(
    con: &mut Commands,
    key: &str,
    after: Option<&str>,
    count: usize,
) -> Result<Page, Error> {
    let start = after.map_or_else(|| "-".to_owned(), |id| format!("({id}"));
    let reply: StreamRangeReply = con.query(
        redis::cmd("XRANGE")
            .arg(key)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count),
    )?;
    // The last raw id, even if that entry did not parse, so paging moves on.
    let last = reply.ids.last().map(|s| s.id.clone());
    Ok((entries(reply), last))
}

/// The last `count` entries, oldest first (`XREVRANGE + - COUNT n`).
pub fn read_last(con: &mut Commands, key: &str, count: usize) -> Result<Page, Error> {
    let reply: StreamRangeReply = con.query(
        redis::cmd("XREVRANGE")
            .arg(key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count),
    )?;
    let last = reply.ids.first().map(|s| s.id.clone());
    let mut v = entries(reply);
    v.reverse();
    Ok((v, last))
}
