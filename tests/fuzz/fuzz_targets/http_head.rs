//! The request head parser and the upgrade check on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shards::http_head::{parse, MAX_HEAD};

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Some((head, used))) => {
            assert!(used <= data.len() && used <= MAX_HEAD);
            let _ = head.check_upgrade();
        }
        Ok(None) => assert!(data.len() < MAX_HEAD),
        Err(_) => {}
    }
});
