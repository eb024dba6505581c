//! Charts as inline SVG, drawn with plotters' SVG backend. Text stays text in the SVG (the
//! browser picks the font, plotters escapes it), so a report needs no font files and no script.
//!
//! Log axes are drawn on linear coordinates holding log values, with tick labels converted
//! back: one code path for every axis kind, and ticks land on round powers (1 KiB, 1 MiB).

use crate::html::escape;
use plotters::prelude::*;

/// Colours that stay apart for up to eight series, on white and in greyscale print.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
];

pub fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

#[derive(Debug, Clone)]
pub enum XAxis {
    /// Message sizes in bytes, log2 scale, labelled 1 B, 1 KiB, 1 MiB.
    Bytes,
    /// Plain numbers (N, seconds).
    Linear,
    /// Whole numbers only (ranks): no tick between two counts.
    Count,
    /// Points 0, 1, 2, … labelled with these strings (run dates in history charts).
    Labels(Vec<String>),
}

#[derive(Debug, Clone, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// A shaded band (x, low, high) drawn under the line: median to p99.
    pub band: Vec<(f64, f64, f64)>,
    /// Points drawn as large hollow red circles: regressions in history charts.
    pub marks: Vec<(f64, f64)>,
    /// Palette index; None takes the series' position. Set it so a network keeps its colour
    /// in every chart even where some chart lacks one of the networks.
    pub colour: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x: XAxis,
    pub log_y: bool,
    pub series: Vec<Series>,
    /// Horizontal reference lines (label, y): link ceilings.
    pub hlines: Vec<(String, f64)>,
}

#[derive(Debug, Clone)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (series name, one value per category); stacked on each other when `stacked`, side by
    /// side otherwise.
    pub series: Vec<(String, Vec<Option<f64>>)>,
    pub stacked: bool,
}

const W: u32 = 760;
const H: u32 = 380;

/// How a legend entry is drawn: a solid line (a series), a dashed line (a reference line) or
/// a filled box (a bar series).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Key {
    Line,
    Dashed,
    Box,
}

/// The legend, as HTML below the drawing: a legend inside the plot area sits on data wherever
/// the data reaches its corner, and long network labels wrap here instead of overflowing.
fn legend(entries: &[(&str, RGBColor, Key)]) -> String {
    let mut s = String::from("<figcaption class=\"legend\">");
    for (name, RGBColor(r, g, b), key) in entries {
        let swatch = match key {
            Key::Line => format!(
                "<svg width=\"22\" height=\"10\"><line x1=\"1\" y1=\"5\" x2=\"21\" y2=\"5\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"3\"/></svg>"
            ),
            Key::Dashed => format!(
                "<svg width=\"22\" height=\"10\"><line x1=\"1\" y1=\"5\" x2=\"21\" y2=\"5\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"2\" stroke-dasharray=\"5 3\"/></svg>"
            ),
            Key::Box => format!(
                "<svg width=\"14\" height=\"12\"><rect x=\"1\" y=\"1\" width=\"12\" height=\"10\" fill=\"rgb({r},{g},{b})\"/></svg>"
            ),
        };
        s.push_str(&format!(
            "<span class=\"key\">{swatch}{}</span>",
            escape(name)
        ));
    }
    s.push_str("</figcaption>");
    s
}

/// Wraps an SVG and its legend in a figure that names its series, so a reader (and the
/// browser test) can tell what each chart shows without parsing the drawing.
fn figure(title: &str, series: &[&str], svg: &str, legend: &str) -> String {
    let names: Vec<String> = series.iter().map(|s| escape(s)).collect();
    format!(
        "<figure class=\"chart\" data-series=\"{}\" aria-label=\"{}\">{svg}{legend}</figure>\n",
        names.join("|"),
        escape(title)
    )
}

/// A chart whose every series holds one value is no chart: a lone dot on an axis hides the
/// number. It is shown as the values themselves.
fn values_figure(title: &str, rows: &[(String, String)]) -> String {
    let mut s = format!(
        "<figure class=\"values\" aria-label=\"{t}\"><figcaption>{t}</figcaption><table class=\"values\"><tbody>",
        t = escape(title)
    );
    for (name, value) in rows {
        s.push_str(&format!(
            "<tr><td>{}</td><td class=\"n\">{}</td></tr>",
            escape(name),
            escape(value)
        ));
    }
    s.push_str("</tbody></table></figure>\n");
    s
}

fn tx(axis: &XAxis, x: f64) -> f64 {
    match axis {
        XAxis::Bytes => x.max(1.0).log2(),
        _ => x,
    }
}

fn ty(log: bool, y: f64) -> f64 {
    if log {
        y.max(1e-12).log10()
    } else {
        y
    }
}

/// Every figure these charts draw (times, rates, Gflops) is positive: a band's low edge, such
/// as a median less a spread wider than it, stops at zero rather than below it.
fn band_low(y: f64) -> f64 {
    y.max(0.0)
}

fn padded(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if (hi - lo).abs() < 1e-12 {
        return if log {
            (lo - 0.5, hi + 0.5)
        } else {
            (lo.min(0.0), hi.max(lo + 1.0) * 1.1)
        };
    }
    let pad = (hi - lo) * 0.05;
    if log {
        (lo - pad, hi + pad)
    } else {
        (
            (lo - pad).min(if lo >= 0.0 { 0.0 } else { lo - pad }),
            hi + pad,
        )
    }
}

pub fn size_label(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if (v - v.round()).abs() < 1e-9 {
        format!("{} {}", v.round(), UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Three significant digits, no exponent for the ranges these charts show.
pub fn number_label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.001 {
        format!("{v:.3}")
    } else {
        format!("{v:.1e}")
    }
}

/// The drawn chart in its figure, or one line saying why it could not be drawn.
fn finish(
    title: &str,
    entries: &[(&str, RGBColor, Key)],
    svg: &str,
    drawn: Result<(), Box<dyn std::error::Error>>,
) -> String {
    // Reference lines are in the legend but are not data series.
    let names: Vec<&str> = entries
        .iter()
        .filter(|e| e.2 != Key::Dashed)
        .map(|e| e.0)
        .collect();
    match drawn {
        Ok(()) => figure(title, &names, svg, &legend(entries)),
        Err(e) => format!(
            "<p class=\"warn\">chart '{}' could not be drawn: {}</p>",
            escape(title),
            escape(&e.to_string())
        ),
    }
}

pub fn line_chart(c: &LineChart) -> String {
    if !c.series.is_empty() && c.series.iter().all(|s| s.points.len() <= 1) {
        let rows: Vec<(String, String)> = c
            .series
            .iter()
            .filter_map(|s| {
                let p = s.points.first()?;
                let at = match &c.x {
                    XAxis::Bytes => format!(" at {}", size_label(p.0)),
                    XAxis::Labels(l) => l
                        .get(p.0.max(0.0) as usize)
                        .map(|l| format!(" ({l})"))
                        .unwrap_or_default(),
                    XAxis::Count => format!(" at {} {}", p.0.round(), c.x_label),
                    XAxis::Linear => format!(" at {} {}", number_label(p.0), c.x_label),
                };
                Some((
                    s.name.clone(),
                    format!("{}: {}{at}", c.y_label, number_label(p.1)),
                ))
            })
            .collect();
        return values_figure(&c.title, &rows);
    }
    let mut svg = String::new();
    let drawn = draw_lines(c, &mut svg);
    let mut entries: Vec<(&str, RGBColor, Key)> = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), colour(s.colour.unwrap_or(i)), Key::Line))
        .collect();
    entries.extend(
        c.hlines
            .iter()
            .enumerate()
            .map(|(i, h)| (h.0.as_str(), colour(i), Key::Dashed)),
    );
    finish(&c.title, &entries, &svg, drawn)
}

fn draw_lines(c: &LineChart, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let xs = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .map(|x| tx(&c.x, x));
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let ys = c
        .series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(|p| p.1)
                .chain(s.band.iter().flat_map(|b| [band_low(b.1), b.2]))
        })
        .chain(c.hlines.iter().map(|h| h.1))
        .filter(|y| !c.log_y || *y > 0.0)
        .map(|y| ty(c.log_y, y));
    let (y0, y1) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
        (a.min(y), b.max(y))
    });
    let (x0, x1) = match c.x {
        XAxis::Labels(_) => (x0 - 0.5, x1 + 0.5),
        _ => padded(x0, x1, true),
    };
    let (y0, y1) = padded(y0, y1, c.log_y);
    {
        let root = SVGBackend::with_string(out, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&c.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let axis = c.x.clone();
        let xfmt = move |v: &f64| match &axis {
            // Only whole powers of two get a label: a tick between them would misname a size.
            XAxis::Bytes if (v - v.round()).abs() > 0.01 => String::new(),
            XAxis::Bytes => size_label(2f64.powf(v.round())),
            XAxis::Linear => number_label(*v),
            XAxis::Count if (v - v.round()).abs() > 0.01 => String::new(),
            XAxis::Count => format!("{}", v.round()),
            XAxis::Labels(l) => {
                let i = v.round();
                if (v - i).abs() > 0.01 || i < 0.0 {
                    String::new()
                } else {
                    l.get(i as usize).cloned().unwrap_or_default()
                }
            }
        };
        let log_y = c.log_y;
        let yfmt = move |v: &f64| number_label(if log_y { 10f64.powf(*v) } else { *v });
        let x_ticks = match &c.x {
            XAxis::Labels(l) => l.len().clamp(2, 8),
            _ => 8,
        };
        chart
            .configure_mesh()
            .x_desc(c.x_label.as_str())
            .y_desc(c.y_label.as_str())
            .x_labels(x_ticks)
            .y_labels(8)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .light_line_style(RGBColor(235, 235, 235))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .draw()?;
        for (i, s) in c.series.iter().enumerate() {
            let col = colour(s.colour.unwrap_or(i));
            if !s.band.is_empty() {
                let mut poly: Vec<(f64, f64)> = s
                    .band
                    .iter()
                    .map(|b| {
                        // On a log axis a low edge at zero is the axis' bottom.
                        let low = band_low(b.1);
                        let y = if c.log_y && low <= 0.0 {
                            y0
                        } else {
                            ty(c.log_y, low)
                        };
                        (tx(&c.x, b.0), y)
                    })
                    .collect();
                poly.extend(
                    s.band
                        .iter()
                        .rev()
                        .map(|b| (tx(&c.x, b.0), ty(c.log_y, b.2))),
                );
                chart.draw_series(std::iter::once(Polygon::new(poly, col.mix(0.15).filled())))?;
            }
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|p| !c.log_y || p.1 > 0.0)
                .map(|p| (tx(&c.x, p.0), ty(c.log_y, p.1)))
                .collect();
            chart.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?;
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, col.filled())))?;
            chart.draw_series(
                s.marks.iter().map(|p| {
                    Circle::new((tx(&c.x, p.0), ty(c.log_y, p.1)), 9, RED.stroke_width(2))
                }),
            )?;
        }
        for (i, (_, y)) in c.hlines.iter().enumerate() {
            let col = colour(i).mix(0.8);
            let y = ty(c.log_y, *y);
            chart.draw_series(DashedLineSeries::new(
                vec![(x0, y), (x1, y)],
                6,
                4,
                col.stroke_width(1),
            ))?;
        }
        root.present()?;
    }
    Ok(())
}

pub fn bar_chart(c: &BarChart) -> String {
    if c.categories.len() == 1 && c.series.len() == 1 {
        let (name, vals) = &c.series[0];
        let rows: Vec<(String, String)> = vals
            .first()
            .copied()
            .flatten()
            .map(|v| {
                (
                    format!("{} ({name})", c.categories[0]),
                    format!("{}: {}", c.y_label, number_label(v)),
                )
            })
            .into_iter()
            .collect();
        return values_figure(&c.title, &rows);
    }
    let mut svg = String::new();
    let drawn = draw_bars(c, &mut svg);
    let entries: Vec<(&str, RGBColor, Key)> = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.0.as_str(), colour(i), Key::Box))
        .collect();
    finish(&c.title, &entries, &svg, drawn)
}

fn draw_bars(c: &BarChart, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let n = c.categories.len().max(1);
    let k = c.series.len().max(1);
    let top = (0..n)
        .map(|i| {
            let vals = c
                .series
                .iter()
                .map(|s| s.1.get(i).copied().flatten().unwrap_or(0.0));
            if c.stacked {
                vals.sum::<f64>()
            } else {
                vals.fold(0.0, f64::max)
            }
        })
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.08 } else { 1.0 };
    {
        let root = SVGBackend::with_string(out, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&c.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)?;
        let cats = c.categories.clone();
        let xfmt = move |v: &f64| {
            let i = v.round();
            if (v - i).abs() > 0.01 || i < 0.0 {
                String::new()
            } else {
                cats.get(i as usize).cloned().unwrap_or_default()
            }
        };
        let yfmt = |v: &f64| number_label(*v);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .y_labels(8)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .y_desc(c.y_label.as_str())
            .light_line_style(RGBColor(235, 235, 235))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .draw()?;
        let mut base = vec![0.0; n];
        for (si, (_, vals)) in c.series.iter().enumerate() {
            let col = colour(si);
            let mut rects = Vec::new();
            for (i, v) in vals.iter().enumerate().take(n) {
                let Some(v) = *v else { continue };
                let (x0, x1, y0) = if c.stacked {
                    (i as f64 - 0.3, i as f64 + 0.3, base[i])
                } else {
                    let w = 0.7 / k as f64;
                    let x0 = i as f64 - 0.35 + w * si as f64;
                    (x0, x0 + w * 0.9, 0.0)
                };
                rects.push(Rectangle::new([(x0, y0), (x1, y0 + v)], col.filled()));
                if c.stacked {
                    base[i] += v;
                }
            }
            chart.draw_series(rects)?;
        }
        root.present()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_chart_is_svg_with_every_series_and_escaped_names() {
        let c = LineChart {
            title: "latency".into(),
            x_label: "size".into(),
            y_label: "µs".into(),
            x: XAxis::Bytes,
            log_y: true,
            series: vec![
                Series {
                    name: "tcp/<lo>".into(),
                    points: vec![(1.0, 10.0), (1024.0, 12.0), (1048576.0, 300.0)],
                    band: vec![(1.0, 10.0, 20.0), (1024.0, 12.0, 25.0)],
                    marks: vec![],
                    colour: None,
                },
                Series {
                    name: "shm".into(),
                    points: vec![(1.0, 1.0), (1024.0, 1.5)],
                    ..Default::default()
                },
            ],
            hlines: vec![("ceiling".into(), 100.0)],
        };
        let html = line_chart(&c);
        assert!(html.starts_with("<figure class=\"chart\" data-series=\"tcp/&lt;lo&gt;|shm\""));
        assert!(html.contains("<svg"), "{html}");
        assert!(html.contains("tcp/&lt;lo&gt;") && !html.contains("tcp/<lo>"));
        let ticks: Vec<&str> = html
            .lines()
            .filter(|l| l.ends_with(" B") || l.ends_with("iB"))
            .collect();
        assert!(ticks.contains(&"1 KiB"), "size ticks: {ticks:?}");
        assert!(html.contains("ceiling"));
    }

    #[test]
    fn bar_chart_stacks_and_labels_categories() {
        let c = BarChart {
            title: "time".into(),
            y_label: "s".into(),
            categories: vec!["run a".into(), "run b".into()],
            series: vec![
                ("update".into(), vec![Some(2.0), Some(3.0)]),
                ("panel".into(), vec![Some(0.5), None]),
            ],
            stacked: true,
        };
        let html = bar_chart(&c);
        assert!(html.contains("data-series=\"update|panel\""));
        assert!(
            html.contains("\nrun a\n") && html.contains("\nrun b\n"),
            "{html}"
        );
        // Three bars plus two legend swatches.
        assert!(html.matches("<rect").count() >= 5, "{html}");
    }

    fn history_like(points: Vec<(f64, f64)>, band: Vec<(f64, f64, f64)>) -> LineChart {
        LineChart {
            title: "latency p50 over time".into(),
            x_label: "run".into(),
            y_label: "µs".into(),
            x: XAxis::Labels(vec!["a".into(), "b".into(), "c".into()]),
            log_y: false,
            series: vec![Series {
                name: "p50".into(),
                points,
                band,
                ..Default::default()
            }],
            hlines: vec![],
        }
    }

    #[test]
    fn a_band_wider_than_its_values_stops_at_zero() {
        // A spread of 40 around 30 µs: the band's low edge would be -10 µs.
        let c = history_like(
            vec![(0.0, 30.0), (1.0, 28.0), (2.0, 29.0)],
            vec![(0.0, -10.0, 70.0), (1.0, 20.0, 36.0), (2.0, 25.0, 33.0)],
        );
        let html = line_chart(&c);
        assert!(html.contains("<svg"), "{html}");
        let negative: Vec<&str> = html
            .lines()
            .filter(|l| l.starts_with('-') && l[1..].parse::<f64>().is_ok())
            .collect();
        assert!(negative.is_empty(), "ticks below zero: {negative:?}");
        // The check sees negative ticks where the data has them.
        let below = history_like(vec![(0.0, -30.0), (1.0, 28.0)], vec![]);
        assert!(line_chart(&below).lines().any(|l| l.starts_with('-')));
    }

    #[test]
    fn a_chart_of_one_point_per_series_shows_the_values() {
        let c = history_like(vec![(1.0, 12.345)], vec![]);
        let html = line_chart(&c);
        assert!(!html.contains("<svg"), "a lone dot drawn: {html}");
        assert!(html.contains("µs: 12.3 (b)"), "{html}");
        let bar = bar_chart(&BarChart {
            title: "Gflops".into(),
            y_label: "Gflops".into(),
            categories: vec!["N=2000 1x1".into()],
            series: vec![("tcp/lo".into(), vec![Some(57.7)])],
            stacked: false,
        });
        assert!(
            !bar.contains("<svg") && bar.contains("Gflops: 57.7"),
            "{bar}"
        );
    }

    #[test]
    fn legends_are_html_below_the_drawing() {
        let c = history_like(vec![(0.0, 1.0), (1.0, 2.0)], vec![]);
        let html = line_chart(&c);
        let svg_end = html.find("</svg>").unwrap();
        let legend = html
            .find("<figcaption class=\"legend\">")
            .expect("a legend");
        assert!(legend > svg_end);
        // The drawing itself does not name the series.
        assert!(!html[..svg_end].contains(">p50<") && !html[..svg_end].contains("\np50\n"));
    }

    #[test]
    fn labels_read_like_people_write_them() {
        assert_eq!(size_label(1.0), "1 B");
        assert_eq!(size_label(4096.0), "4 KiB");
        assert_eq!(size_label(268435456.0), "256 MiB");
        assert_eq!(number_label(1234.5), "1234");
        assert_eq!(number_label(2.34567), "2.35");
    }
}
