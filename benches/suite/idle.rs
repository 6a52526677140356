//! `idle`: wake-ups with no connection, then the connect phase (server CPU,
//! frames and context switches per connection until every client has its
//! watch answer), then memory per idle connection and CPU while the clients
//! watch with nothing published; and the connect floor in the same run.

use crate::children::Fleet;
use crate::floor_server;
use crate::measure::{
    by_thread_text, counter, cpu_pct, machine_row, per_each, progress, wakeup_rates, wakeups_row,
    watch,
};
use crate::procs::{self, Usage};
use crate::reconnect;
use crate::server::serve;
use crate::setup::{course_names, fleet, server_flags, start_redis, wait_open};
use crate::{Opts, Outcome};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use testkit::proc::Seatboard;

/// Runs `idle` (`idle_cluster` under `--redis-mode cluster`).
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new(if o.cluster { "idle_cluster" } else { "idle" });
    let (redis, mode) = start_redis(o);
    let server = serve(&redis, &server_flags(o, mode));
    std::thread::sleep(Duration::from_secs(1));
    quiet_wakeups(&mut out, o, &server);
    let courses = course_names(o.courses);
    let before = procs::usage(server.child.id());
    let (f, open, connect_cpu) = connect_phase(&mut out, o, &server, &courses, before);
    watching(&mut out, o, &server, f, before, open);
    drop(server);
    if !o.no_floor && !o.no_watch && o.transport == "ws" {
        connect_floor_rows(&mut out, o, &courses, connect_cpu);
    }
    out
}

/// Wake-ups with no connection at all: every thread's context switches.
fn quiet_wakeups(out: &mut Outcome, o: &Opts, server: &Seatboard) {
    let quiet = o.seconds.min(20.0);
    let w0 = procs::wakeups(server.child.id());
    std::thread::sleep(Duration::from_secs_f64(quiet));
    let per_thread = wakeup_rates(server.child.id(), &w0, quiet);
    wakeups_row(out, "wakeups_per_s_no_connection", &per_thread, quiet);
}

/// The connect phase: from the first connect until every client has its
/// watch answer (or is open, under --no-watch). Returns the fleet, the
/// clients open and the server's connect CPU per connection (µs).
fn connect_phase(
    out: &mut Outcome,
    o: &Opts,
    server: &Seatboard,
    courses: &[String],
    before: Usage,
) -> (Fleet, u64, f64) {
    let th0 = procs::cpu_by_thread(server.child.id());
    let frames0 = server.metric("seatboard_frames_sent_total");
    let cw0 = procs::wakeups(server.child.id());
    let t_connect = Instant::now();
    let mut f = fleet(o, server.port, courses, o.skew, false, o.seconds + 600.0);
    let answered = reconnect::wait_answered(
        &mut f,
        o.clients as u64,
        !o.no_watch,
        Duration::from_secs(120),
    );
    let connected = procs::usage(server.child.id());
    let th1 = procs::cpu_by_thread(server.child.id());
    let frames = server.metric("seatboard_frames_sent_total") - frames0;
    let cw1 = procs::wakeups(server.child.id());
    let connect_secs = t_connect.elapsed().as_secs_f64();
    let open = wait_open(o, &mut f, o.clients, "idle");
    let connect_cpu = connect_rows(out, (before, connected), (&th0, &th1), open, connect_secs);
    let per = frames / open.max(1) as f64;
    out.row(
        "connect_frames_per_conn",
        format!("{per:.2} frames queued per connection in the connect phase ({frames:.0})"),
        json!(per),
    );
    let switches = per_each(&cw0, &cw1, open);
    let total: f64 = switches.values().sum();
    out.row(
        "connect_switches_per_conn",
        format!(
            "{total:.2} context switches per connection in the connect phase (by thread {})",
            by_thread_text(&switches, 2)
        ),
        json!({"per_conn": total, "by_thread": switches}),
    );
    out.check(answered, "not every client had its watch answer");
    (f, open, connect_cpu)
}

/// The window with every client connected and watching (nothing
/// published): the shards' timers and the clients' pings, and the ingest
/// thread asleep on its pub/sub connection(s); memory per connection.
fn watching(
    out: &mut Outcome,
    o: &Opts,
    server: &Seatboard,
    mut f: Fleet,
    before: Usage,
    open: u64,
) {
    std::thread::sleep(Duration::from_secs(3));
    let after = procs::usage(server.child.id());
    let k0 = procs::machine_ticks();
    let window = o.seconds;
    let w0 = procs::wakeups(server.child.id());
    watch(o, "idle", "frames", window, server, &mut f);
    let end = procs::usage(server.child.id());
    let k1 = procs::machine_ticks();
    let per_thread = wakeup_rates(server.child.id(), &w0, window);
    wakeups_row(out, "wakeups_per_s_watching", &per_thread, window);
    let marks = f.mark();
    let lg_cpu = f.cpu_us();
    drop(f.report());
    let per_conn =
        (after.rss_kib.saturating_sub(before.rss_kib) * 1024) as f64 / open.max(1) as f64;
    let cpu = cpu_pct(after, end, window);
    out.row(
        "clients",
        format!("{open} open of {}", o.clients),
        json!(open),
    );
    out.row(
        "rss_before_kib",
        format!("{} KiB", before.rss_kib),
        json!(before.rss_kib),
    );
    out.row(
        "rss_after_kib",
        format!("{} KiB", after.rss_kib),
        json!(after.rss_kib),
    );
    out.row(
        "rss_per_conn_bytes",
        format!("{per_conn:.0} B per connection"),
        json!(per_conn),
    );
    let anon_per_conn =
        (after.rss_anon_kib.saturating_sub(before.rss_anon_kib) * 1024) as f64 / open.max(1) as f64;
    out.row(
        "rss_anon_per_conn_bytes",
        format!("{anon_per_conn:.0} B per connection of anonymous memory (heap and stacks, not the binary's pages)"),
        json!(anon_per_conn),
    );
    let per_conn_end =
        (end.rss_kib.saturating_sub(before.rss_kib) * 1024) as f64 / open.max(1) as f64;
    out.row(
        "rss_end_per_conn_bytes",
        format!("{per_conn_end:.0} B per connection at the end of the window (past two pings and pongs with --seconds 70)"),
        json!(per_conn_end),
    );
    out.row(
        "idle_cpu_pct_core",
        format!("{cpu:.2}% of one core over {window:.0} s"),
        json!(cpu),
    );
    out.row(
        "frames_received",
        counter(&marks, "frames").to_string(),
        json!(counter(&marks, "frames")),
    );
    out.row(
        "loadgen_cpu_s",
        format!("{:.1} s", lg_cpu as f64 / 1e6),
        json!(lg_cpu as f64 / 1e6),
    );
    out.check(open as usize == o.clients, "not every client connected");
    machine_row(out, k0, k1);
}

/// The connect floor in the same run (see `floor_server::run_connect`): as many
/// clients at the same rate, each answered with the least a server can do;
/// the server's connect CPU per connection as a ratio to it.
fn connect_floor_rows(out: &mut Outcome, o: &Opts, courses: &[String], ours_us: f64) {
    let port = testkit::proc::free_port();
    let cfg = floor_server::ConnectConfig {
        port,
        max_secs: o.seconds as u64 + 600,
    };
    let mut child = floor_server::spawn("__connect_floor", &cfg);
    // The floor answers a watch message: its clients send one.
    let o = &Opts {
        upgrade_courses: false,
        ..o.clone()
    };
    let pid = child.id();
    progress(o, "[idle] the connect floor".into());
    let (u0, w0) = (procs::usage(pid), procs::wakeups(pid));
    let mut f = fleet(o, port, courses, o.skew, false, o.seconds + 600.0);
    let answered =
        reconnect::wait_answered(&mut f, o.clients as u64, true, Duration::from_secs(120));
    let (u1, w1) = (procs::usage(pid), procs::wakeups(pid));
    let switches: f64 = per_each(&w0, &w1, o.clients as u64).values().sum();
    drop(f.report());
    let _ = child.kill();
    let _ = child.wait();
    let floor_us = u1.cpu_us.saturating_sub(u0.cpu_us) as f64 / o.clients.max(1) as f64;
    out.row(
        "connect_floor_cpu_us_per_conn",
        format!("{floor_us:.0} µs per connection (one epoll loop: accept, 101 + hello in one write, the watch answer and count in another)"),
        json!(floor_us),
    );
    out.row(
        "connect_floor_switches_per_conn",
        format!("{switches:.2} context switches per connection in the connect floor"),
        json!(switches),
    );
    let ratio = ours_us / floor_us.max(1e-9);
    out.row(
        "connect_ratio_to_floor",
        format!("{ratio:.2}x the connect floor's CPU per connection"),
        json!(ratio),
    );
    out.check(
        answered,
        "connect floor: not every client had its watch answer",
    );
}

/// The server CPU of the connect phase, per connection and by thread.
fn connect_rows(
    out: &mut Outcome,
    (a, b): (Usage, Usage),
    (th0, th1): (&BTreeMap<String, u64>, &BTreeMap<String, u64>),
    open: u64,
    secs: f64,
) -> f64 {
    let cpu = b.cpu_us.saturating_sub(a.cpu_us);
    let per = cpu as f64 / open.max(1) as f64;
    let by_thread = per_each(th0, th1, open);
    out.row(
        "connect_cpu_us_per_conn",
        format!(
            "{per:.0} µs of server CPU per connection ({:.2} s over the {secs:.1} s connect phase; by thread {})",
            cpu as f64 / 1e6,
            by_thread_text(&by_thread, 0)
        ),
        json!({"per_conn_us": per, "total_s": cpu as f64 / 1e6, "secs": secs, "by_thread_us": by_thread}),
    );
    per
}
