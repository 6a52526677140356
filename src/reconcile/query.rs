//! A small lexer over the operator's `--query` (contract §11: "one `SELECT`
//! ... with one bind parameter"): what the statement opens with, its bind
//! parameters and how many statements it holds, counted outside string
//! literals (`'...'` with `''`; PostgreSQL `E'...'` and MySQL strings with
//! backslash escapes too), quoted names (`"..."`, MySQL `` `...` ``),
//! comments (`-- ` to the end of the line, MySQL `#`, `/* */`, nested on
//! PostgreSQL) and PostgreSQL dollar-quoted strings (`$tag$...$tag$`). It
//! only reads: the database parses the query, this finds what would make it
//! fail on every check (a second parameter, a second statement) before the
//! start.

use super::flags::Kind;
use std::collections::BTreeSet;

/// What a query holds outside literals, quoted names and comments.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Shape {
    /// The first word, lowercased (`"("` when it opens with a parenthesis).
    pub first: String,
    /// PostgreSQL's `$N` parameters, each number once.
    pub numbered: BTreeSet<u32>,
    /// MySQL's `?` parameters.
    pub marks: usize,
    /// Statements with something in them (a trailing `;` adds none).
    pub statements: usize,
}

/// A byte that may continue a name (`$` continues one on PostgreSQL).
fn name_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// The index just past the literal or quoted name opened by `q` at `at`:
/// a doubled `q` stays inside, and so does any byte after a backslash when
/// `backslash`; the end of `b` when it is never closed.
fn quoted(b: &[u8], at: usize, q: u8, backslash: bool) -> usize {
    let mut i = at + 1;
    while i < b.len() {
        match b[i] {
            b'\\' if backslash => i += 2,
            c if c == q && b.get(i + 1) == Some(&q) => i += 2,
            c if c == q => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// The index just past the `/* */` comment at `at` (`nested`: PostgreSQL's
/// comments nest).
fn block_comment(b: &[u8], at: usize, nested: bool) -> usize {
    let mut depth = 0usize;
    let mut i = at;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            depth = if nested { depth + 1 } else { 1 };
            i += 2;
        } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
            depth = depth.saturating_sub(1);
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// The index of the end of the line from `at`.
fn line_end(b: &[u8], at: usize) -> usize {
    b[at..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(b.len(), |p| at + p)
}

/// The opening tag of a PostgreSQL dollar-quoted string at `at` (`$$` or
/// `$name$`), if one starts there.
fn dollar_tag(b: &[u8], at: usize) -> Option<&[u8]> {
    let mut j = at + 1;
    if b.get(j)
        .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_' || c >= 0x80)
    {
        while b.get(j).is_some_and(|&c| name_byte(c)) {
            j += 1;
        }
    }
    (b.get(j) == Some(&b'$')).then(|| &b[at..=j])
}

/// The index just past the dollar-quoted string at `at` whose tag is `tag`.
fn dollar_quoted(b: &[u8], at: usize, tag: &[u8]) -> usize {
    let body = at + tag.len();
    b[body..]
        .windows(tag.len())
        .position(|w| w == tag)
        .map_or(b.len(), |p| body + p + tag.len())
}

/// The digits of a `$N` parameter at `at` (None when `$` is not followed by
/// a digit) and the index past them.
fn numbered(b: &[u8], at: usize) -> Option<(u32, usize)> {
    let digits = b[at + 1..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    if digits == 0 {
        return None;
    }
    let end = at + 1 + digits;
    let n = std::str::from_utf8(&b[at + 1..end])
        .ok()?
        .parse()
        .unwrap_or(u32::MAX);
    Some((n, end))
}

/// How the byte at `at` is read: the index after what it starts, and
/// whether that is part of a statement (not blank, not a comment).
fn token(b: &[u8], at: usize, kind: Kind, shape: &mut Shape) -> (usize, bool) {
    let pg = kind == Kind::Postgres;
    let after_name = at > 0 && (name_byte(b[at - 1]) || (pg && b[at - 1] == b'$'));
    let next = b.get(at + 1).copied();
    match b[at] {
        b'\'' => {
            // PostgreSQL's escape strings: E'...' (the E a word on its own).
            let escape = pg
                && at > 0
                && matches!(b[at - 1], b'E' | b'e')
                && (at < 2 || !name_byte(b[at - 2]));
            (quoted(b, at, b'\'', escape || !pg), true)
        }
        b'"' => (quoted(b, at, b'"', !pg), true),
        b'`' if !pg => (quoted(b, at, b'`', false), true),
        // MySQL's `--` comment needs a blank after it (`1--1` is arithmetic).
        b'-' if next == Some(b'-')
            && (pg || b.get(at + 2).is_none_or(|c| c.is_ascii_whitespace())) =>
        {
            (line_end(b, at), false)
        }
        b'#' if !pg => (line_end(b, at), false),
        b'/' if next == Some(b'*') => (block_comment(b, at, pg), false),
        b'$' if pg && !after_name => {
            if let Some((n, end)) = numbered(b, at) {
                shape.numbered.insert(n);
                (end, true)
            } else if let Some(tag) = dollar_tag(b, at) {
                (dollar_quoted(b, at, tag), true)
            } else {
                (at + 1, true)
            }
        }
        b'?' if !pg => {
            shape.marks += 1;
            (at + 1, true)
        }
        c if c.is_ascii_whitespace() => (at + 1, false),
        _ => (at + 1, true),
    }
}

/// The first word of `b` from `at`, lowercased (`"("` for a parenthesis).
fn word(b: &[u8], at: usize) -> String {
    if b[at] == b'(' {
        return "(".into();
    }
    let len = b[at..].iter().take_while(|c| name_byte(**c)).count().max(1);
    String::from_utf8_lossy(&b[at..at + len]).to_ascii_lowercase()
}

/// Reads `sql` as `kind`'s dialect.
pub fn lex(sql: &str, kind: Kind) -> Shape {
    let b = sql.as_bytes();
    let mut shape = Shape::default();
    // Something since the start or the last `;`.
    let mut open = false;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b';' {
            shape.statements += usize::from(open);
            open = false;
            i += 1;
            continue;
        }
        if shape.first.is_empty() && !b[i].is_ascii_whitespace() && !comment_at(b, i, kind) {
            shape.first = word(b, i);
        }
        let (end, counts) = token(b, i, kind, &mut shape);
        open |= counts;
        i = end.max(i + 1);
    }
    shape.statements += usize::from(open);
    shape
}

/// Whether a comment starts at `at`.
fn comment_at(b: &[u8], at: usize, kind: Kind) -> bool {
    let mut probe = Shape::default();
    matches!(b[at], b'-' | b'#' | b'/') && !token(b, at, kind, &mut probe).1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(sql: &str) -> Shape {
        lex(sql, Kind::Postgres)
    }

    fn my(sql: &str) -> Shape {
        lex(sql, Kind::Mysql)
    }

    fn params(sql: &str) -> Vec<u32> {
        pg(sql).numbered.into_iter().collect()
    }

    const Q: &str = "SELECT course FROM t WHERE updated_at >= ";

    #[test]
    fn postgres_parameters_are_counted_outside_literals_names_and_comments() {
        assert_eq!(params(&format!("{Q}$1")), [1]);
        assert_eq!(params(&format!("{Q}$1 OR u > $1")), [1], "$1 twice is one");
        assert_eq!(params(&format!("{Q}$1 AND u < $2")), [1, 2]);
        assert_eq!(params(&format!("{Q}$10")), [10]);
        assert_eq!(params(&format!("{Q}$1::timestamptz")), [1]);
        for hidden in [
            "'$2'",
            "'it''s $2'",
            "E'\\' $2'",
            "\"col$2\"",
            "\"a\"\"$2\"",
            "$$ $2 $$",
            "$q$ it's $2 $q$",
            "$a$ $b$ $2 $b$ $a$",
            "/* $2 /* nested $2 */ $2 */",
            "-- $2\n",
            "a$2",
        ] {
            assert_eq!(params(&format!("{Q}$1 AND x = {hidden}")), [1], "{hidden}");
        }
        // A `?` is an operator on PostgreSQL (jsonb), never a parameter.
        assert_eq!(pg(&format!("{Q}$1 AND j ? 'k'")).marks, 0);
    }

    #[test]
    fn mysql_marks_are_counted_outside_literals_names_and_comments() {
        assert_eq!(my(&format!("{Q}?")).marks, 1);
        assert_eq!(my(&format!("{Q}? AND u < ?")).marks, 2);
        for hidden in [
            "'why?'",
            "'it''s ?'",
            "'it\\'s ?'",
            "\"?\"",
            "`col?`",
            "`a``?`",
            "/* ? */",
            "-- ?\n",
            "# ?\n",
        ] {
            assert_eq!(my(&format!("{Q}? AND x = {hidden}")).marks, 1, "{hidden}");
        }
        // `$1` means nothing on MySQL.
        assert!(my(&format!("{Q}$1")).numbered.is_empty());
        // `--` with no blank after it is not a comment on MySQL.
        assert_eq!(my(&format!("{Q}1--? AND ?")).marks, 2);
    }

    #[test]
    fn statements_are_counted_and_a_trailing_semicolon_is_none() {
        assert_eq!(pg(&format!("{Q}$1")).statements, 1);
        assert_eq!(pg(&format!("{Q}$1;")).statements, 1);
        assert_eq!(pg(&format!("{Q}$1 ;  \n\t")).statements, 1);
        assert_eq!(pg(&format!("{Q}$1; -- done\n")).statements, 1);
        assert_eq!(pg(&format!("{Q}$1; SELECT 1")).statements, 2);
        assert_eq!(pg(&format!("{Q}$1;;SELECT 1;")).statements, 2);
        assert_eq!(my(&format!("{Q}?; SELECT 1")).statements, 2);
        for hidden in ["';'", "\";\"", "$$;$$", "/* ; */", "-- ;\n"] {
            assert_eq!(
                pg(&format!("{Q}$1 AND x = {hidden}")).statements,
                1,
                "{hidden}"
            );
        }
        for hidden in ["';'", "\";\"", "`;`", "# ;\n"] {
            assert_eq!(
                my(&format!("{Q}? AND x = {hidden}")).statements,
                1,
                "{hidden}"
            );
        }
        assert_eq!(pg("").statements, 0);
        assert_eq!(pg("  ; ").statements, 0);
    }

    #[test]
    fn the_first_word_skips_blanks_and_comments() {
        assert_eq!(pg("  SELECT 1").first, "select");
        assert_eq!(pg("select*from t").first, "select");
        assert_eq!(
            pg("-- the reconciler's\n/* query */ WITH x AS (SELECT 1)").first,
            "with"
        );
        assert_eq!(pg("(SELECT 1)").first, "(");
        assert_eq!(my("# a\nDELETE FROM t").first, "delete");
        assert_eq!(pg("selection").first, "selection");
        assert_eq!(pg("").first, "");
    }

    #[test]
    fn unclosed_quotes_and_odd_bytes_never_panic() {
        for sql in [
            "'",
            "\"",
            "$",
            "$a",
            "$a$",
            "/*",
            "/* /*",
            "--",
            "E'\\",
            "$99999999999",
            "é$1",
        ] {
            let _ = pg(sql);
            let _ = my(sql);
        }
        assert_eq!(params("SELECT $99999999999"), [u32::MAX]);
    }
}
