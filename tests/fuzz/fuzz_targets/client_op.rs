//! The client op parser: whatever parses names a valid course.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shards::client_op::ClientOp;
use shards::snapshot::valid_course;

fuzz_target!(|text: &str| {
    if let Ok(ClientOp::Watch(c) | ClientOp::Unwatch(c) | ClientOp::Roster(c)) =
        ClientOp::parse(text)
    {
        assert!(valid_course(&c));
    }
});
