//! Parsing of the text messages a browser sends (`watch`, `unwatch`, `roster`).

use crate::snapshot::valid_course;
use serde::Deserialize;

/// A parsed client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    /// Start receiving a course.
    Watch(String),
    /// Stop receiving a course.
    Unwatch(String),
    /// Admin: list a course's viewers.
    Roster(String),
}

/// A recoverable mistake, answered with an `error` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpError {
    /// Not a JSON object.
    BadJson,
    /// Missing or unknown `op`.
    UnknownOp,
    /// Missing or invalid `course`.
    BadCourse,
    /// Over the per-connection course limit.
    TooManyCourses,
    /// Not allowed for this role.
    Forbidden,
}

impl OpError {
    /// The `code` field of the error message.
    pub fn code(self) -> &'static str {
        match self {
            OpError::BadJson => "bad_json",
            OpError::UnknownOp => "unknown_op",
            OpError::BadCourse => "bad_course",
            OpError::TooManyCourses => "too_many_courses",
            OpError::Forbidden => "forbidden",
        }
    }

    /// The human-readable `message` field.
    pub fn message(self) -> &'static str {
        match self {
            OpError::BadJson => "message is not a JSON object",
            OpError::UnknownOp => "op must be watch, unwatch or roster",
            OpError::BadCourse => "course must be 1-64 of [A-Za-z0-9_.-]",
            OpError::TooManyCourses => "a connection may watch at most 32 courses",
            OpError::Forbidden => "admin only",
        }
    }
}

/// The `message` field, as the error's text.
impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for OpError {}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    op: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    course: Option<&'a serde_json::value::RawValue>,
}

impl ClientOp {
    /// Parses one text message.
    pub fn parse(text: &str) -> Result<ClientOp, OpError> {
        if !text.trim_start().starts_with('{') {
            return Err(OpError::BadJson);
        }
        let wire: Wire<'_> = serde_json::from_str(text).map_err(|_| OpError::BadJson)?;
        let op: String = wire
            .op
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .ok_or(OpError::UnknownOp)?;
        let make: fn(String) -> ClientOp = match op.as_str() {
            "watch" => ClientOp::Watch,
            "unwatch" => ClientOp::Unwatch,
            "roster" => ClientOp::Roster,
            _ => return Err(OpError::UnknownOp),
        };
        let course: String = wire
            .course
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .ok_or(OpError::BadCourse)?;
        if !valid_course(&course) {
            return Err(OpError::BadCourse);
        }
        Ok(make(course))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops() {
        assert_eq!(
            ClientOp::parse(r#"{"op":"watch","course":"CS101"}"#),
            Ok(ClientOp::Watch("CS101".into()))
        );
        assert_eq!(
            ClientOp::parse(r#" {"course":"X","op":"unwatch","extra":[1]}"#),
            Ok(ClientOp::Unwatch("X".into()))
        );
        assert_eq!(
            ClientOp::parse(r#"{"op":"roster","course":"a.b-c_d"}"#),
            Ok(ClientOp::Roster("a.b-c_d".into()))
        );
    }

    #[test]
    fn an_op_error_reads_as_its_message() {
        let e: &dyn std::error::Error = &OpError::Forbidden;
        assert_eq!(e.to_string(), OpError::Forbidden.message());
    }

    #[test]
    fn errors() {
        let cases = [
            ("hello", OpError::BadJson),
            ("[1]", OpError::BadJson),
            ("{\"op\":", OpError::BadJson),
            (r#"{"course":"X"}"#, OpError::UnknownOp),
            (r#"{"op":"subscribe","course":"X"}"#, OpError::UnknownOp),
            (r#"{"op":5,"course":"X"}"#, OpError::UnknownOp),
            (r#"{"op":"watch"}"#, OpError::BadCourse),
            (r#"{"op":"watch","course":""}"#, OpError::BadCourse),
            (r#"{"op":"watch","course":"a b"}"#, OpError::BadCourse),
            (r#"{"op":"watch","course":12}"#, OpError::BadCourse),
        ];
        for (text, want) in cases {
            assert_eq!(ClientOp::parse(text), Err(want), "{text}");
        }
    }
}
