//! Everything the rehearsal made in Redis deleted (state hashes, presence
//! keys), before it starts (a rehearsal cut short earlier) and at the end.

use crate::redis::commands::Commands;

/// Deletes `<state-prefix>C` and `<presence-prefix>C` of every course; the
/// keys left (counted again after), or the error. One pipeline of `DEL`s and
/// one of `EXISTS` (per primary in a cluster): Redis may be far away.
pub fn delete(
    link: &mut Commands,
    names: &[String],
    state: &str,
    presence: &str,
) -> Result<u64, crate::redis::Error> {
    let keys: Vec<String> = names
        .iter()
        .flat_map(|n| [format!("{state}{n}"), format!("{presence}{n}")])
        .collect();
    let one = |name: &str, k: &String| {
        let mut c = ::redis::cmd(name);
        c.arg(k);
        c
    };
    let dels: Vec<::redis::Cmd> = keys.iter().map(|k| one("DEL", k)).collect();
    link.pipeline::<()>(&dels)?;
    let exists: Vec<::redis::Cmd> = keys.iter().map(|k| one("EXISTS", k)).collect();
    let left: Vec<u64> = link.pipeline(&exists)?;
    Ok(left.iter().sum())
}
