//! `/metrics` read by the reference Prometheus text parser (Python
//! prometheus_client), and values that move when they should.

use crate::common;
use common::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const PARSER: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        out[s.name + ("{" + labels + "}" if labels else "")] = s.value
    out["__type__" + fam.name] = fam.type
print(json.dumps(out))
"#;

/// Parses an exposition with prometheus_client; panics if it is not valid.
fn parse(text: &str) -> HashMap<String, Value> {
    let mut child = Command::new("python3")
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client rejected /metrics (tests/run.sh installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("parser output")
}

fn num(m: &HashMap<String, Value>, key: &str) -> f64 {
    m.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no sample {key}"))
}

#[test]
fn metrics_parse_and_move() {
    let sb = Seatboard::start(&["demo", "--shards", "2"]);
    let before = parse(&sb.metrics());
    for reason in ["json", "schema", "channel_mismatch", "too_large"] {
        assert_eq!(
            num(
                &before,
                &format!("seatboard_ingest_rejected_total{{reason=\"{reason}\"}}")
            ),
            0.0
        );
    }
    assert_eq!(
        before["__type__seatboard_tick_duration_seconds"],
        "histogram"
    );
    assert_eq!(
        before["__type__seatboard_update_latency_seconds"],
        "histogram"
    );
    for family in [
        "seatboard_connections",
        "seatboard_handshakes_accepted",
        "seatboard_handshakes_refused",
        "seatboard_frames_sent",
        "seatboard_frames_dropped",
        "seatboard_resyncs",
        "seatboard_bytes_out",
        "seatboard_slow_consumer_closes",
        "seatboard_ingest_messages",
        "seatboard_redis_connected",
        "seatboard_redis_reconnects",
        "seatboard_subscriptions",
        "seatboard_firehose",
        "seatboard_presence_pipeline_seconds",
        "seatboard_draining",
    ] {
        assert!(
            before.contains_key(&format!("__type__{family}")),
            "missing family {family}"
        );
    }

    assert_eq!(before["__type__process_cpu_seconds"], "counter");
    assert_eq!(before["__type__process_resident_memory_bytes"], "gauge");
    assert!(
        num(&before, "process_resident_memory_bytes") > 1e6,
        "RSS of a running node"
    );
    let cpu_before = num(&before, "process_cpu_seconds_total");
    let mut ws = ws_connect(sb.port, "/ws?user=m1").expect("connect");
    send_json(&mut ws, json!({"op":"watch","course":"ART150"}));
    next_of_type(&mut ws, "frame", Duration::from_secs(5)).expect("answer");
    next_of_type(&mut ws, "frame", Duration::from_secs(5)).expect("a live frame");
    wait_for(Duration::from_secs(5), || {
        (metric_value(&sb.metrics(), "seatboard_ingest_messages_total") > 0.0).then_some(())
    })
    .expect("snapshots ingested");
    let _ = http_get(sb.port, "/ws"); // not an upgrade: refused 400
    let after = wait_for(Duration::from_secs(5), || {
        let m = parse(&sb.metrics());
        (num(&m, "seatboard_subscriptions") == 1.0).then_some(m)
    })
    .expect("one course subscribed");
    let conns: f64 = (0..2)
        .map(|i| num(&after, &format!("seatboard_connections{{shard=\"{i}\"}}")))
        .sum();
    assert_eq!(conns, 1.0);
    assert_eq!(num(&after, "seatboard_handshakes_accepted_total"), 1.0);
    assert_eq!(
        num(
            &after,
            "seatboard_handshakes_refused_total{reason=\"bad_upgrade\"}"
        ),
        1.0
    );
    assert!(
        num(&after, "seatboard_frames_sent_total") > num(&before, "seatboard_frames_sent_total")
    );
    assert!(num(&after, "seatboard_bytes_out_total") > 0.0);
    assert!(
        num(&after, "seatboard_ingest_messages_total")
            > num(&before, "seatboard_ingest_messages_total")
    );
    assert!(num(&after, "seatboard_update_latency_seconds_count") > 0.0);
    assert_eq!(num(&after, "seatboard_redis_connected"), 1.0);
    assert_eq!(num(&after, "seatboard_firehose"), 0.0);
    let ticks: f64 = (0..2)
        .map(|i| {
            num(
                &after,
                &format!("seatboard_tick_duration_seconds_count{{shard=\"{i}\"}}"),
            )
        })
        .sum();
    assert!(ticks > 0.0, "render passes are timed");
    let cpu_after = num(&after, "process_cpu_seconds_total");
    // The process CPU clock moves with any work (a WebSocket served, frames
    // rendered, scrapes answered), never in 10 ms steps that may read 0.
    assert!(
        cpu_before > 0.0 && cpu_after > cpu_before,
        "CPU seconds {cpu_before} then {cpu_after}"
    );
    drop(ws);
    let closed = wait_for(Duration::from_secs(5), || {
        let m = parse(&sb.metrics());
        let c: f64 = (0..2)
            .map(|i| num(&m, &format!("seatboard_connections{{shard=\"{i}\"}}")))
            .sum();
        (c == 0.0).then_some(())
    });
    assert!(closed.is_some(), "the connection gauge falls back to 0");
}
