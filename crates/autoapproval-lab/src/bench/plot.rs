//! The pickup-latency distributions of the designs as one SVG: a CDF per
//! design over a logarithmic time axis, so milliseconds and minutes fit.

use std::fmt::Write;

use super::report::DesignReport;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 460.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 70.0;
/// Tick labels, the axis title and the legend sit below the plot.
const BOTTOM: f64 = 90.0;
const COLORS: [&str; 4] = ["#1b7837", "#d6604d", "#4393c3", "#762a83"];

/// The SVG of every design's pickup-latency CDF; `subtitle` (lines split
/// at `\n`) says how it was measured.
pub fn cdf_svg(designs: &[DesignReport], subtitle: &str) -> String {
    let samples = designs
        .iter()
        .flat_map(|d| d.pickup_samples_ms.iter().copied())
        .filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = samples.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo_exp, hi_exp) = if lo <= hi {
        (lo.log10().floor() as i32, hi.log10().ceil() as i32)
    } else {
        (0, 1)
    };
    let hi_exp = hi_exp.max(lo_exp + 1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |ms: f64| {
        let e = ms.max(10f64.powi(lo_exp)).log10();
        LEFT + (e - f64::from(lo_exp)) / f64::from(hi_exp - lo_exp) * plot_w
    };
    let y = |fraction: f64| TOP + (1.0 - fraction) * plot_h;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">Pickup latency (eligible → claimed), cumulative share of requests</text>"#
    );
    for (i, line) in subtitle.lines().take(2).enumerate() {
        let _ = writeln!(
            svg,
            r##"<text x="{LEFT}" y="{}" fill="#555">{}</text>"##,
            40 + 15 * i,
            escape(line)
        );
    }
    // Grid and axes: a line per decade, a tick per quarter.
    for e in lo_exp..=hi_exp {
        let gx = x(10f64.powi(e));
        let _ = writeln!(
            svg,
            r##"<line x1="{gx:.1}" y1="{TOP}" x2="{gx:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            TOP + plot_h
        );
        let _ = writeln!(
            svg,
            r#"<text x="{gx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + plot_h + 18.0,
            duration_label(10f64.powi(e))
        );
    }
    for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let gy = y(q);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/>"##,
            LEFT + plot_w
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}%</text>"#,
            LEFT - 6.0,
            gy + 4.0,
            q * 100.0
        );
    }
    // The 99th percentile, dashed: the figure the comparison is judged by.
    let p99 = y(0.99);
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{p99:.1}" x2="{:.1}" y2="{p99:.1}" stroke="#999" stroke-dasharray="4 3"/>"##,
        LEFT + plot_w
    );
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" fill="#777" font-size="10">99</text>"##,
        LEFT + plot_w + 3.0,
        p99 + 8.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">pickup latency (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        TOP + plot_h + 38.0
    );
    for (i, design) in designs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut sorted: Vec<f64> = design
            .pickup_samples_ms
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        let mut points = String::new();
        let mut previous = 0.0;
        for (k, v) in sorted.iter().enumerate() {
            let px = x(*v);
            // A step: up at each sample.
            let _ = write!(
                points,
                "{px:.1},{:.1} {px:.1},{:.1} ",
                y(previous),
                y((k + 1) as f64 / n)
            );
            previous = (k + 1) as f64 / n;
        }
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.trim_end()
        );
        // The legend: one row below the axis title, a column per design.
        let legend_x = LEFT + plot_w / designs.len().max(1) as f64 * i as f64;
        let legend_y = TOP + plot_h + 66.0;
        let p99 = design.pickup_ms.map_or("no samples".into(), |p| {
            format!("p99 {}", duration_label(p.p99))
        });
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="3"/>"#,
            legend_y - 4.0,
            legend_x + 24.0,
            legend_y - 4.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{legend_y:.1}">{} — {p99}</text>"#,
            legend_x + 30.0,
            escape(&design.design)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// `0.1 ms`, `10 ms`, `1 s`, `100 s`, `20 min`.
fn duration_label(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms} ms")
    } else if ms < 1000.0 {
        format!("{} ms", round(ms))
    } else if ms < 1_000_000.0 {
        format!("{} s", round(ms / 1000.0))
    } else {
        format!("{} min", round(ms / 60_000.0))
    }
}

fn round(v: f64) -> String {
    if v >= 10.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::Percentiles;

    fn design(name: &str, samples: Vec<f64>) -> DesignReport {
        DesignReport {
            design: name.into(),
            requests: samples.len() as u64,
            approved: samples.len() as u64,
            pickup_ms: Percentiles::of(&samples),
            pickup_samples_ms: samples,
            throughput_per_s: 0.0,
            cpu_seconds_per_1000: 0.0,
            database_cpu_seconds_per_1000: None,
            lab_cpu_seconds_per_1000: None,
            db_statements_per_approval: None,
            db_statements_top: Vec::new(),
            kube_writes_per_approval: 0.0,
            control_plane: None,
            external_calls_per_approval: 0.0,
            duplicate_creations: 0,
            overlapping_creations: 0,
            failed_claims: Default::default(),
            database: "PostgreSQL".into(),
        }
    }

    #[test]
    fn the_plot_spans_every_sample_on_decades_and_draws_one_line_per_design() {
        let svg = cdf_svg(
            &[
                design("ours", vec![2.0, 3.0, 5.0]),
                design("seed-old", vec![6_000.0, 20_000.0]),
            ],
            "a & b",
        );
        assert!(svg.starts_with("<svg"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 2);
        // Decades from 1 ms to 100 s.
        assert!(svg.contains(">1 ms<") && svg.contains(">100 s<"), "{svg}");
        assert!(svg.contains("ours — p99 5 ms"), "{svg}");
        assert!(svg.contains("a &amp; b"), "{svg}");
        // The last step of a design reaches 100 % (y = TOP).
        assert!(svg.contains(&format!(",{TOP:.1}\"")), "{svg}");
    }
}
