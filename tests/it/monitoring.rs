//! The Grafana dashboard and the Prometheus alert rules next to the units
//! (`systemd/monitoring/`): every metric they name is one a real `serve`
//! exports on `/metrics`, `promtool check rules` accepts the rules, and
//! `promtool test rules` shows each alert firing on the situation it names.

use crate::common;
use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/monitoring")
}

/// PromQL words that are not metric names when not followed by `(`.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
];

/// Grouping clauses whose parenthesised list holds label names, not series.
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The index just past the bracket that closes the one at `start`
/// (string literals inside are skipped).
fn skip_balanced(s: &[u8], start: usize, open: u8, close: u8) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i < s.len() {
        match s[i] {
            b'"' | b'\'' | b'`' => i = skip_string(s, i) - 1,
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    s.len()
}

fn skip_string(s: &[u8], start: usize) -> usize {
    let quote = s[start];
    let mut i = start + 1;
    while i < s.len() && s[i] != quote {
        if s[i] == b'\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The metric names a PromQL expression selects.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let s = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = skip_string(s, i);
        } else if c == b'{' {
            i = skip_balanced(s, i, b'{', b'}');
        } else if c == b'[' {
            i = skip_balanced(s, i, b'[', b']');
        } else if c == b'$' {
            // A Grafana variable ($__rate_interval, ${datasource}).
            i += 1;
            while i < s.len() && (ident(s[i]) || s[i] == b'{' || s[i] == b'}') {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == b'.' {
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'.') {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let mut j = i;
            while j < s.len() && s[j].is_ascii_whitespace() {
                j += 1;
            }
            let call = j < s.len() && s[j] == b'(';
            if call && GROUPING.contains(&word) {
                i = skip_balanced(s, j, b'(', b')');
            } else if !call && !KEYWORDS.contains(&word) {
                names.insert(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every query in the dashboard: panel targets (rows included) and the
/// template variables' `label_values(metric, label)`.
fn dashboard_exprs(dash: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(e)) = m.get("expr") {
                    out.push(e.clone());
                }
                for v in m.values() {
                    walk(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    for var in dash["templating"]["list"].as_array().into_iter().flatten() {
        let q = var["query"]["query"].as_str().or(var["query"].as_str());
        if var["type"] == "query" {
            let q = q.expect("a query variable has a query");
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.split(',').next())
                .unwrap_or_else(|| panic!("unexpected variable query {q}"));
            out.push(inner.to_string());
        }
    }
    out
}

/// Every `expr:` of the alert rules (kept on one line each).
fn rule_exprs(text: &str) -> Vec<String> {
    let rules = text
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            t.starts_with("- alert:") || t.starts_with("- record:")
        })
        .count();
    let exprs: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .map(|e| e.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
        .collect();
    assert_eq!(
        exprs.len(),
        rules,
        "every rule needs a one-line expr: (block scalars are not read)"
    );
    assert!(
        exprs.iter().all(|e| !e.is_empty() && e != "|" && e != ">"),
        "an expr is empty or a block scalar"
    );
    exprs
}

/// The sample names a real hub and a real reconciler export (histograms:
/// `_bucket`, `_sum`, `_count`; the reconciler's every series is there from
/// start, its database unreachable or not).
fn exported() -> BTreeSet<String> {
    let redis = RedisServer::start();
    let sb = Seatboard::start(&["serve", "--auth", "none", "--redis", &redis.uri()]);
    let mut text = wait_for(Duration::from_secs(20), || {
        let m = sb.metrics();
        (metric_value(&m, "seatboard_redis_connected") == 1.0).then_some(m)
    })
    .expect("the hub reached Redis");
    let port = free_port();
    let mut rec = seatboard_command()
        .args([
            "reconcile",
            "--redis",
            &redis.uri(),
            "--metrics",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["--db", &format!("postgres://u@127.0.0.1:{}/x", free_port())])
        .args(["--query", "SELECT * FROM t WHERE updated_at >= $1"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("seatboard reconcile");
    let got = wait_for(Duration::from_secs(20), || {
        let m = testkit::scrape::metrics(port);
        m.contains("seatboard_reconcile_checks_total").then_some(m)
    });
    let _ = rec.kill();
    let _ = rec.wait();
    text.push_str(&got.expect("the reconciler's /metrics"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let end = l.find(['{', ' ']).unwrap_or(l.len());
            l[..end].to_string()
        })
        .collect()
}

#[test]
fn the_promql_reader_finds_metric_names() {
    let got = metric_names(
        r#"sum by (instance, job) (rate(a_total{reason=~"x|y"}[5m])) / on(instance) group_left(shard) b_gauge > 0.5 and histogram_quantile(0.99, sum without (shard) (rate(c_bucket{i=~"$instance"}[$__rate_interval]))) > 1e3 offset 5m"#,
    );
    let want: BTreeSet<String> = ["a_total", "b_gauge", "c_bucket"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(got, want);
}

#[test]
fn dashboard_and_alerts_name_only_exported_metrics() {
    let dir = monitoring_dir();
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("seatboard-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    assert!(dash["title"].is_string() && dash["panels"].is_array());
    let rules = std::fs::read_to_string(dir.join("seatboard-alerts.yml")).expect("rules");
    let exported = exported();

    let mut named = BTreeSet::new();
    for (file, exprs) in [
        ("seatboard-dashboard.json", dashboard_exprs(&dash)),
        ("seatboard-alerts.yml", rule_exprs(&rules)),
    ] {
        assert!(exprs.len() >= 5, "{file}: only {} queries", exprs.len());
        for e in exprs {
            let names = metric_names(&e);
            assert!(!names.is_empty(), "{file}: no metric in {e}");
            for n in names {
                assert!(
                    exported.contains(&n),
                    "{file} names {n}, which /metrics does not export (in {e})"
                );
                named.insert(n);
            }
        }
    }
    // The alerts the operator guide promises.
    for alert in [
        "SeatboardRedisDown",
        "SeatboardSlowConsumerClosesRising",
        "SeatboardAcceptRefusalsRising",
        "SeatboardShardStalled",
        "SeatboardNearConnectionCap",
    ] {
        assert!(
            rules.contains(&format!("- alert: {alert}\n")),
            "no alert {alert}"
        );
    }
    // The pinning and driver metrics are on the dashboard.
    for m in [
        "seatboard_shard_core",
        "seatboard_driver_shards",
        "seatboard_pin_failures_total",
    ] {
        assert!(named.contains(m), "the dashboard does not show {m}");
    }
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(monitoring_dir())
        .output()
        .expect("promtool must be installed (tests/run.sh installs Debian's prometheus)");
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_checks_and_tests_the_rules() {
    promtool(&["check", "rules", "seatboard-alerts.yml"]);
    promtool(&["test", "rules", "seatboard-alerts.test.yml"]);
}
