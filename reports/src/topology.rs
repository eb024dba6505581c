//! The topology section: for each `link` run that measured more than one pair (a cabled
//! cluster's cables, or every pair on one network), the ranks as nodes and every measured pair
//! as an edge labelled with its best bandwidth and p50 latency, coloured by its share of the
//! fastest edge; pairs with no cable are dashed. Beside it, the all-pairs heat maps of
//! bandwidth and latency. Read from the result file alone (`results.pairs`, `network.links`,
//! `network.topology`), so it needs no suite's code.

use crate::html::escape;
use crate::load::Loaded;
use crate::views::{network_label, newest_per_network};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One measured pair's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Measured {
    gbit_per_s: Option<f64>,
    p50_us: Option<f64>,
}

/// What one run says of its ranks and pairs.
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    /// Per rank: its name ("0 m1").
    names: Vec<String>,
    /// The measured pairs (lower rank first), with how many cables each has (1 on one network).
    pairs: BTreeMap<[usize; 2], (Measured, usize)>,
    unlinked: Vec<[usize; 2]>,
    /// "ring", "full-mesh", ... where the run was over links.
    shape: Option<String>,
}

/// Edges at or above this share of the fastest are drawn green, at or above `SLOW` orange,
/// red below.
const GOOD: f64 = 0.9;
const SLOW: f64 = 0.6;

fn shape_of(l: &Loaded) -> Option<Shape> {
    let r = &l.result;
    let pairs = r.results.get("pairs")?.as_array()?;
    if pairs.len() < 2 {
        return None;
    }
    let mut measured: BTreeMap<[usize; 2], (Measured, usize)> = BTreeMap::new();
    for p in pairs {
        let ranks = p.get("ranks")?.as_array()?;
        let (a, b) = (
            ranks.first()?.as_u64()? as usize,
            ranks.get(1)?.as_u64()? as usize,
        );
        let m = Measured {
            gbit_per_s: p.get("best_gbit_per_s").and_then(Value::as_f64),
            p50_us: p.get("latency_p50_us").and_then(Value::as_f64),
        };
        measured.insert([a.min(b), a.max(b)], (m, 1));
    }
    for link in &r.network.links {
        let key = [
            link.ranks[0].min(link.ranks[1]),
            link.ranks[0].max(link.ranks[1]),
        ];
        if let Some(e) = measured.get_mut(&key) {
            e.1 = e.1.max(link.cable + 1);
        }
    }
    let unlinked = r
        .network
        .topology
        .as_ref()
        .map(|t| t.unlinked.clone())
        .unwrap_or_default();
    let size = r
        .hosts
        .iter()
        .flat_map(|h| h.ranks.iter().copied())
        .chain(measured.keys().flat_map(|k| k.iter().copied()))
        .chain(unlinked.iter().flat_map(|k| k.iter().copied()))
        .max()?
        + 1;
    // Ranks are named by the launcher's host labels where the cables say them (namespaces of
    // one machine share a hostname), else by their host's name.
    let mut names: Vec<String> = (0..size).map(|i| i.to_string()).collect();
    for h in &r.hosts {
        for &rank in &h.ranks {
            if rank < size {
                names[rank] = format!("{rank} {}", h.hostname);
            }
        }
    }
    for link in &r.network.links {
        for (i, &rank) in link.ranks.iter().enumerate() {
            if rank < size {
                names[rank] = format!("{rank} {}", link.hosts[i]);
            }
        }
    }
    Some(Shape {
        names,
        pairs: measured,
        unlinked,
        shape: r.network.topology.as_ref().map(|t| t.shape.clone()),
    })
}

/// The section over every loaded link run that measured several pairs, newest per network;
/// None where there is none.
pub fn section(loaded: &[Loaded]) -> Option<(String, Value)> {
    let runs: Vec<&Loaded> = loaded.iter().filter(|l| l.result.suite == "link").collect();
    let mut body = String::new();
    let mut data = serde_json::Map::new();
    for l in newest_per_network(&runs) {
        let Some(s) = shape_of(l) else { continue };
        let label = network_label(&l.result.network);
        body.push_str(&format!(
            "<h3>{}</h3>\n<div class=\"topology\">{}{}{}</div>\n",
            escape(&label),
            graph(&s, &label),
            heat_map(&s, "Best bandwidth, Gbit/s", |m| m.gbit_per_s, true, 2),
            heat_map(&s, "p50 one-way latency, µs", |m| m.p50_us, false, 1),
        ));
        data.insert(label, summary(&s));
    }
    if data.is_empty() {
        return None;
    }
    let intro = "<p>Each measured pair of ranks as an edge: its best bandwidth and p50 latency \
                 (from <code>tbbench link</code>), coloured by its share of the fastest edge \
                 (green at 90% or more, orange at 60% or more, red below); a dashed edge is a \
                 pair with no cable; ×2 marks a pair with two cables.</p>\n";
    Some((format!("{intro}{body}"), Value::Object(data)))
}

fn summary(s: &Shape) -> Value {
    let fastest = fastest(s);
    json!({
        "ranks": s.names,
        "shape": s.shape,
        "edges": s.pairs.iter().map(|(k, (m, cables))| json!({
            "ranks": k,
            "cables": cables,
            "gbit_per_s": m.gbit_per_s,
            "latency_p50_us": m.p50_us,
            "share_of_fastest": m.gbit_per_s.zip(fastest).map(|(g, f)| g / f),
        })).collect::<Vec<_>>(),
        "unlinked": s.unlinked,
    })
}

fn fastest(s: &Shape) -> Option<f64> {
    s.pairs
        .values()
        .filter_map(|(m, _)| m.gbit_per_s)
        .fold(None, |acc: Option<f64>, g| {
            Some(acc.map_or(g, |a| a.max(g)))
        })
        .filter(|f| *f > 0.0)
}

fn edge_colour(share: Option<f64>) -> &'static str {
    match share {
        Some(x) if x >= GOOD => "#1a7f37",
        Some(x) if x >= SLOW => "#d97706",
        Some(_) => "#cf222e",
        None => "#888888",
    }
}

/// The ranks on a circle, an edge per measured pair and a dashed one per pair with no cable.
fn graph(s: &Shape, label: &str) -> String {
    const W: f64 = 560.0;
    const H: f64 = 440.0;
    let n = s.names.len();
    let (cx, cy, radius) = (W / 2.0, H / 2.0, 150.0);
    let at = |i: usize| {
        // Rank 0 at the top, the others clockwise.
        let a = -std::f64::consts::FRAC_PI_2 + 2.0 * std::f64::consts::PI * i as f64 / n as f64;
        (cx + radius * a.cos(), cy + radius * a.sin())
    };
    let fastest = fastest(s);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{}\">",
        escape(&format!("cables of {label}"))
    );
    for [a, b] in &s.unlinked {
        let ((x1, y1), (x2, y2)) = (at(*a), at(*b));
        svg.push_str(&format!(
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"#999\" stroke-width=\"1.5\" stroke-dasharray=\"6 5\"><title>{a}-{b}: no cable</title></line>"
        ));
    }
    let mut labels = String::new();
    for ([a, b], (m, cables)) in &s.pairs {
        let ((x1, y1), (x2, y2)) = (at(*a), at(*b));
        let share = m.gbit_per_s.zip(fastest).map(|(g, f)| g / f);
        let width = 2.0 + 4.0 * share.unwrap_or(0.0);
        let text = edge_text(m, *cables);
        svg.push_str(&format!(
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{}\" stroke-width=\"{width:.1}\"><title>{}</title></line>",
            edge_colour(share),
            escape(&format!("{a}-{b}: {text}"))
        ));
        // An edge between neighbours on the circle is labelled at its middle; a chord a
        // third of the way from its lower rank, so the labels of chords that cross at the
        // centre (a mesh's diagonals) do not cover each other.
        let along = if b - a == 1 || b - a == n - 1 {
            0.5
        } else {
            1.0 / 3.0
        };
        let (lx, ly) = (x1 + (x2 - x1) * along, y1 + (y2 - y1) * along);
        labels.push_str(&format!(
            "<text x=\"{lx:.1}\" y=\"{ly:.1}\" font-size=\"11\" text-anchor=\"middle\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">{}</text>",
            escape(&text)
        ));
    }
    svg.push_str(&labels);
    for (i, name) in s.names.iter().enumerate() {
        let (x, y) = at(i);
        // Names go outside the circle of ranks.
        let (dx, dy) = ((x - cx) / radius, (y - cy) / radius);
        let (tx, ty) = (x + dx * 36.0, y + dy * 36.0 + 4.0);
        let anchor = if dx > 0.3 {
            "start"
        } else if dx < -0.3 {
            "end"
        } else {
            "middle"
        };
        svg.push_str(&format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"16\" fill=\"#1f77b4\"/><text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"13\" fill=\"#fff\" text-anchor=\"middle\">{i}</text><text x=\"{tx:.1}\" y=\"{ty:.1}\" font-size=\"12\" text-anchor=\"{anchor}\">{}</text>",
            y + 4.5,
            escape(name.split_once(' ').map_or(name.as_str(), |(_, h)| h))
        ));
    }
    svg.push_str("</svg>");
    format!(
        "<figure class=\"topology\" aria-label=\"{}\">{svg}</figure>",
        escape(&format!("topology of {label}"))
    )
}

fn edge_text(m: &Measured, cables: usize) -> String {
    let mut parts = Vec::new();
    if let Some(g) = m.gbit_per_s {
        parts.push(format!("{g:.2} Gb/s"));
    }
    if let Some(l) = m.p50_us {
        parts.push(format!("{l:.1} µs"));
    }
    if cables > 1 {
        parts.push(format!("×{cables}"));
    }
    if parts.is_empty() {
        "measured".into()
    } else {
        parts.join(" · ")
    }
}

/// An N×N table of one figure per pair, each cell shaded by how good it is against the best
/// (higher bandwidth, lower latency); a pair with no cable says so.
fn heat_map(
    s: &Shape,
    title: &str,
    pick: impl Fn(&Measured) -> Option<f64>,
    higher_is_better: bool,
    decimals: usize,
) -> String {
    let values: Vec<f64> = s
        .pairs
        .values()
        .filter_map(|(m, _)| pick(m))
        .filter(|v| *v > 0.0)
        .collect();
    if values.is_empty() {
        return String::new();
    }
    let best = if higher_is_better {
        values.iter().copied().fold(f64::MIN, f64::max)
    } else {
        values.iter().copied().fold(f64::MAX, f64::min)
    };
    let n = s.names.len();
    let mut t = format!(
        "<table class=\"heat\"><caption>{}</caption><thead><tr><th>rank</th>",
        escape(title)
    );
    for i in 0..n {
        t.push_str(&format!("<th>{i}</th>"));
    }
    t.push_str("</tr></thead><tbody>");
    for a in 0..n {
        t.push_str(&format!("<tr><th>{}</th>", escape(&s.names[a])));
        for b in 0..n {
            let key = [a.min(b), a.max(b)];
            let cell = if a == b {
                "<td class=\"n\">·</td>".to_string()
            } else if s.unlinked.contains(&key) {
                "<td class=\"n\" title=\"no cable\">–</td>".to_string()
            } else {
                match s.pairs.get(&key).and_then(|(m, _)| pick(m)) {
                    Some(v) if v > 0.0 => {
                        let good = if higher_is_better { v / best } else { best / v };
                        format!(
                            "<td class=\"n\" style=\"background:rgba(31,119,180,{:.2})\">{v:.decimals$}</td>",
                            0.08 + 0.5 * good.clamp(0.0, 1.0),
                        )
                    }
                    _ => "<td class=\"n\"></td>".to_string(),
                }
            };
            t.push_str(&cell);
        }
        t.push_str("</tr>");
    }
    t.push_str("</tbody></table>");
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring4() -> Shape {
        let mut pairs = BTreeMap::new();
        for (k, g, l) in [
            ([0, 1], 0.4, 8.7),
            ([1, 2], 0.5, 8.8),
            ([2, 3], 0.2, 11.3),
            ([0, 3], 0.5, 5.0),
        ] {
            let m = Measured {
                gbit_per_s: Some(g),
                p50_us: Some(l),
            };
            pairs.insert(k, (m, 1));
        }
        Shape {
            names: (0..4).map(|i| format!("{i} m{i}")).collect(),
            pairs,
            unlinked: vec![[0, 2], [1, 3]],
            shape: Some("ring".into()),
        }
    }

    #[test]
    fn edges_are_coloured_by_their_share_of_the_fastest_and_unlinked_pairs_dashed() {
        let svg = graph(&ring4(), "tcp/links");
        // The two 0.5 Gb/s cables green, the 0.4 one orange (80%), the 0.2 one red (40%).
        assert_eq!(svg.matches("stroke=\"#1a7f37\"").count(), 2, "{svg}");
        assert_eq!(svg.matches("stroke=\"#d97706\"").count(), 1);
        assert_eq!(svg.matches("stroke=\"#cf222e\"").count(), 1);
        assert_eq!(svg.matches("stroke-dasharray").count(), 2);
        assert!(svg.contains("0-2: no cable"));
        assert!(svg.contains("0.40 Gb/s · 8.7 µs"), "{svg}");
        for i in 0..4 {
            assert!(svg.contains(&format!(">m{i}</text>")), "host m{i} named");
        }
    }

    #[test]
    fn heat_maps_mark_the_missing_cables_and_shade_the_best_darkest() {
        let t = heat_map(&ring4(), "bw", |m| m.gbit_per_s, true, 2);
        assert_eq!(t.matches("title=\"no cable\"").count(), 4, "both halves");
        assert!(t.contains("rgba(31,119,180,0.58)\">0.50"), "{t}");
        let l = heat_map(&ring4(), "lat", |m| m.p50_us, false, 1);
        assert!(l.contains("rgba(31,119,180,0.58)\">5.0"), "{l}");
        let s = summary(&ring4());
        assert_eq!(s["edges"][0]["share_of_fastest"], 0.8);
        assert_eq!(s["unlinked"], json!([[0, 2], [1, 3]]));
    }
}
