//! The `--report` file: one self-contained HTML page (inline SVG, no script,
//! nothing loaded from elsewhere) that plots the run's per-second series and
//! each node's CPU and RSS, so an operator sees at once whether the window
//! would hold.

use super::nodes::NodeSeen;
use super::verdict::Second;
use std::fmt::Write as _;

/// One line of a plot: its label, colour, and points (seconds, value).
type Line = (String, &'static str, Vec<(f64, f64)>);

/// One line of the run's series: its label, colour, and value in a second.
type SeriesLine<'a> = (&'a str, &'static str, fn(&Second) -> f64);

/// Colours of the nodes' lines, in turn.
const NODE_COLOURS: [&str; 6] = [
    "#1f6feb", "#bc4c00", "#2da44e", "#8250df", "#cf222e", "#6e7781",
];

/// The run's plots: title and lines.
fn series_plots(series: &[Second]) -> Vec<(String, Vec<Line>)> {
    let plots: [(&str, Vec<SeriesLine>); 4] = [
        (
            "Viewers",
            vec![("viewers", "#1f6feb", |s| s.viewers as f64)],
        ),
        (
            "Connects and refusals per second",
            vec![
                ("connects", "#2da44e", |s| s.connects as f64),
                ("refused", "#cf222e", |s| s.refused as f64),
            ],
        ),
        (
            "Snapshots published per second",
            vec![("published", "#8250df", |s| s.published as f64)],
        ),
        (
            "Publish-to-screen latency (ms)",
            vec![
                ("p50", "#1f6feb", |s| s.p50_ms),
                ("p99", "#bc4c00", |s| s.p99_ms),
            ],
        ),
    ];
    plots
        .into_iter()
        .map(|(title, lines)| {
            let lines = lines
                .into_iter()
                .map(|(l, c, f)| {
                    let pts = series.iter().map(|s| (s.t as f64, f(s))).collect();
                    (l.to_string(), c, pts)
                })
                .collect();
            (title.to_string(), lines)
        })
        .collect()
}

/// The nodes' plots (none when no node's `/metrics` answered).
fn node_plots(nodes: &[NodeSeen]) -> Vec<(String, Vec<Line>)> {
    let nodes: Vec<&NodeSeen> = nodes.iter().filter(|n| !n.series.is_empty()).collect();
    if nodes.is_empty() {
        return Vec::new();
    }
    let lines = |f: fn(&super::nodes::Point) -> f64| -> Vec<Line> {
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let pts = n.series.iter().map(|p| (p.t, f(p))).collect();
                (node_label(n, &nodes), NODE_COLOURS[i % 6], pts)
            })
            .collect()
    };
    vec![
        ("Node CPU (% of a core)".into(), lines(|p| p.cpu_pct)),
        (
            "Node RSS (MiB)".into(),
            lines(|p| p.rss_bytes as f64 / (1 << 20) as f64),
        ),
    ]
}

/// A node's URL, with its start time when several processes answered there.
fn node_label(n: &NodeSeen, all: &[&NodeSeen]) -> String {
    if all.iter().filter(|m| m.url == n.url).count() > 1 {
        format!("{} (started {:.0})", n.url, n.started)
    } else {
        n.url.clone()
    }
}

/// The whole page for `series` and `nodes`, headed by the verdict line.
pub fn html(series: &[Second], nodes: &[NodeSeen], verdict: &str) -> String {
    let mut out = String::with_capacity(16 * 1024);
    out.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>seatboard rehearsal</title>");
    out.push_str("<style>body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328}svg{display:block;margin:4px 0 20px;background:#f6f8fa}</style></head><body>");
    let _ = write!(
        out,
        "<h1>seatboard rehearsal</h1><p id=\"verdict\">{}</p>",
        escape(verdict)
    );
    if !nodes.is_empty() {
        out.push_str("<h2>Distance to Redis</h2><ul id=\"distance\">");
        for n in nodes {
            let _ = write!(out, "<li>{}</li>", escape(&n.distance()));
        }
        out.push_str("</ul>");
    }
    let t_max = series.last().map_or(1, |s| s.t.max(1)) as f64;
    for (title, lines) in series_plots(series).iter().chain(&node_plots(nodes)) {
        plot(&mut out, title, lines, t_max);
    }
    out.push_str("</body></html>\n");
    out
}

/// One SVG chart of `lines` over `t_max` seconds, with its largest value on the axis.
fn plot(out: &mut String, title: &str, lines: &[Line], t_max: f64) {
    const W: f64 = 720.0;
    const H: f64 = 180.0;
    let t_max = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.0))
        .fold(t_max, f64::max)
        .max(1.0);
    let y_max = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let legend: Vec<String> = lines
        .iter()
        .map(|(l, c, _)| format!("<span style=\"color:{c}\">{}</span>", escape(l)))
        .collect();
    let _ = write!(out, "<h2>{} ({})</h2>", escape(title), legend.join(", "));
    let longest = lines.iter().map(|l| l.2.len()).max().unwrap_or(0);
    let _ = write!(
        out,
        "<svg class=\"plot\" data-points=\"{longest}\" width=\"{W}\" height=\"{}\" viewBox=\"0 0 {W} {}\" role=\"img\" aria-label=\"{}\">",
        H + 20.0,
        H + 20.0,
        escape(title)
    );
    let _ = write!(out, "<text x=\"4\" y=\"12\" font-size=\"11\">{y_max:.0}</text><text x=\"4\" y=\"{}\" font-size=\"11\">0 s</text><text x=\"{}\" y=\"{}\" font-size=\"11\">{t_max:.0} s</text>", H + 16.0, W - 40.0, H + 16.0);
    for (label, colour, points) in lines {
        let points: Vec<String> = points
            .iter()
            .map(|(t, y)| format!("{:.1},{:.1}", t / t_max * W, H - y / y_max * (H - 16.0)))
            .collect();
        let _ = write!(
            out,
            "<polyline data-series=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            escape(label),
            points.join(" ")
        );
    }
    out.push_str("</svg>");
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rehearse::nodes::{NodeSeen, Point};

    fn second(t: u64) -> Second {
        Second {
            t,
            viewers: 10 * t,
            connects: 10,
            refused: t % 2,
            published: 100,
            p50_ms: 20.0,
            p99_ms: 80.0 + t as f64,
        }
    }

    #[test]
    fn every_plot_draws_every_second_and_loads_nothing() {
        let series: Vec<Second> = (0..30).map(second).collect();
        let page = html(&series, &[], "pass: <every> board correct");
        assert_eq!(
            page.matches("<svg class=\"plot\" data-points=\"30\"")
                .count(),
            4
        );
        for label in ["viewers", "connects", "refused", "published", "p50", "p99"] {
            let at = page
                .find(&format!("data-series=\"{label}\" "))
                .expect(label);
            let points = &page[at..page[at..].find("/>").map_or(page.len(), |e| at + e)];
            assert_eq!(
                points.matches(',').count(),
                30,
                "{label}: one point per second"
            );
        }
        assert!(page.contains("&lt;every&gt;"), "the verdict is escaped");
        for outside in ["src=", "href=", "http", "<script", "url("] {
            assert!(!page.contains(outside), "the page loads {outside}");
        }
    }

    #[test]
    fn each_node_has_a_line_in_the_cpu_and_rss_plots() {
        let series: Vec<Second> = (1..=10).map(second).collect();
        let points = |k: f64| -> Vec<Point> {
            (1..=8)
                .map(|t| Point {
                    t: t as f64,
                    cpu_pct: k * t as f64,
                    rss_bytes: 50 << 20,
                })
                .collect()
        };
        let nodes = [
            NodeSeen::with_series("http://127.0.0.1:1", 1.0, points(5.0)),
            NodeSeen::with_series("http://127.0.0.1:1", 2.0, points(7.0)),
            NodeSeen::with_series("http://127.0.0.1:2", 3.0, Vec::new()),
        ];
        let page = html(&series, &nodes, "pass");
        assert_eq!(page.matches("<svg class=\"plot\"").count(), 6);
        for title in ["Node CPU (% of a core)", "Node RSS (MiB)"] {
            let at = page.find(&format!("aria-label=\"{title}\"")).expect(title);
            let svg = &page[at..at + page[at..].find("</svg>").expect("closed")];
            assert_eq!(
                svg.matches("<polyline").count(),
                2,
                "{title}: one line a node that answered"
            );
            assert!(
                svg.contains("(started 2)"),
                "{title}: two processes at one URL told apart"
            );
        }
        assert!(page.contains("data-points=\"8\""));
    }
}
