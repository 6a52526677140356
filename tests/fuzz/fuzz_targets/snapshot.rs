//! The Redis snapshot parser: accepted snapshots are valid and round-trip.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shards::snapshot::valid_course;
use shards::Snapshot;

fuzz_target!(|data: &[u8]| {
    for channel in [None, Some("CS101")] {
        if let Ok(s) = Snapshot::parse(data, channel) {
            assert!(valid_course(&s.course));
            let again = Snapshot::parse(s.to_payload().as_bytes(), Some(&s.course))
                .expect("a re-published snapshot parses");
            assert_eq!(
                (
                    again.section,
                    again.total_seats,
                    again.seats_taken,
                    again.version
                ),
                (s.section, s.total_seats, s.seats_taken, s.version)
            );
        }
    }
});
