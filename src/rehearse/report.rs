//! The `--report` file: one self-contained HTML page (inline SVG, no script,
//! nothing loaded from elsewhere) that plots the run's per-second series, so
//! an operator sees at once whether the window would hold.

use super::verdict::Second;
use std::fmt::Write as _;

/// One line of a plot: its label, colour, and value in a second.
type Line<'a> = (&'a str, &'a str, fn(&Second) -> f64);

/// One plot: its title and the lines it draws.
type Plot<'a> = (&'a str, Vec<Line<'a>>);

/// The whole page for `series`, headed by the verdict line.
pub fn html(series: &[Second], verdict: &str) -> String {
    let plots: [Plot; 4] = [
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
    let mut out = String::with_capacity(16 * 1024);
    out.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>seatboard rehearsal</title>");
    out.push_str("<style>body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328}svg{display:block;margin:4px 0 20px;background:#f6f8fa}</style></head><body>");
    let _ = write!(
        out,
        "<h1>seatboard rehearsal</h1><p id=\"verdict\">{}</p>",
        escape(verdict)
    );
    for (title, lines) in &plots {
        plot(&mut out, title, lines, series);
    }
    out.push_str("</body></html>\n");
    out
}

/// One SVG chart of `lines` over time, with its largest value on the axis.
fn plot(out: &mut String, title: &str, lines: &[Line], series: &[Second]) {
    const W: f64 = 720.0;
    const H: f64 = 180.0;
    let t_max = series.last().map_or(1, |s| s.t.max(1)) as f64;
    let y_max = lines
        .iter()
        .flat_map(|(_, _, f)| series.iter().map(f))
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let legend: Vec<String> = lines
        .iter()
        .map(|(l, c, _)| format!("<span style=\"color:{c}\">{l}</span>"))
        .collect();
    let _ = write!(out, "<h2>{} ({})</h2>", escape(title), legend.join(", "));
    let _ = write!(
        out,
        "<svg class=\"plot\" data-points=\"{}\" width=\"{W}\" height=\"{}\" viewBox=\"0 0 {W} {}\" role=\"img\" aria-label=\"{}\">",
        series.len(),
        H + 20.0,
        H + 20.0,
        escape(title)
    );
    let _ = write!(out, "<text x=\"4\" y=\"12\" font-size=\"11\">{y_max:.0}</text><text x=\"4\" y=\"{}\" font-size=\"11\">0 s</text><text x=\"{}\" y=\"{}\" font-size=\"11\">{t_max:.0} s</text>", H + 16.0, W - 40.0, H + 16.0);
    for (label, colour, f) in lines {
        let points: Vec<String> = series
            .iter()
            .map(|s| {
                format!(
                    "{:.1},{:.1}",
                    s.t as f64 / t_max * W,
                    H - f(s) / y_max * (H - 16.0)
                )
            })
            .collect();
        let _ = write!(
            out,
            "<polyline data-series=\"{label}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
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
        let page = html(&series, "pass: <every> board correct");
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
}
