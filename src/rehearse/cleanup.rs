//! Everything the rehearsal made in Redis deleted (state hashes, presence
//! keys), before it starts (a rehearsal cut short earlier) and at the end.

use crate::redis::commands::Commands;

/// Deletes `<state-prefix>C` and `<presence-prefix>C` of every course; the
/// keys left (counted again after), or the error.
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
    for k in &keys {
        let mut c = ::redis::cmd("DEL");
        c.arg(k);
        link.query::<i64>(&c)?;
    }
    let mut left = 0;
    for k in &keys {
        let mut c = ::redis::cmd("EXISTS");
        c.arg(k);
        left += link.query::<u64>(&c)?;
    }
    Ok(left)
}
