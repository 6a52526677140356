//! Token lookup (Bearer, `?token=`, cookie) on arbitrary heads.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shards::http_head::parse;

fuzz_target!(|data: &[u8]| {
    // A fixed request line so the fuzzer spends its time in headers and query.
    let mut req = b"GET /ws?".to_vec();
    req.extend_from_slice(data);
    if let Ok(Some((head, _))) = parse(&req) {
        if let Some(t) = head.token() {
            assert!(!t.is_empty());
        }
        let _ = head.query_param("user");
        let _ = head.cookie_value("seatboard_token");
    }
});
