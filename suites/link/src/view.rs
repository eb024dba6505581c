//! The link suite's view: latency and bandwidth against message size, networks as series.

use serde::Deserialize;
use serde_json::json;
use tbbench_reports::chart::{self, size_label, BarChart, LineChart, Series, XAxis};
use tbbench_reports::html::{self, opt_num, Cell};
use tbbench_reports::load::Loaded;
use tbbench_reports::metrics::{median_and_half_iqr, Better, Metric};
use tbbench_reports::views::{newest_per_network, series_names, SuiteView};
use tbbench_schema::{ResultFile, Summary};

/// The report views of the results this crate writes (suite "link").
pub fn views() -> Vec<Box<dyn SuiteView>> {
    vec![Box::new(LinkView)]
}

pub struct LinkView;

#[derive(Debug, Deserialize)]
struct LinkResults {
    #[serde(default)]
    latency: Vec<Latency>,
    #[serde(default)]
    bandwidth: Vec<Bandwidth>,
    #[serde(default)]
    ceiling_source: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Latency {
    pair: [usize; 2],
    size_bytes: u64,
    one_way_us: Summary,
    #[serde(default)]
    samples_ns: Vec<u64>,
    #[serde(default)]
    wrong_bytes: u64,
}

#[derive(Debug, Deserialize)]
struct AvgPeak {
    avg: f64,
    peak: f64,
}

#[derive(Debug, Deserialize)]
struct Bandwidth {
    pair: [usize; 2],
    mode: String,
    size_bytes: u64,
    gbit_per_s: AvgPeak,
    gib_per_s: AvgPeak,
    msg_rate_per_s: f64,
    #[serde(default)]
    percent_of_ceiling: Option<AvgPeak>,
    #[serde(default)]
    ceiling_gbit_per_s: Option<f64>,
    iteration_gbit_per_s: Summary,
    #[serde(default)]
    wrong_bytes: u64,
}

fn parse(r: &ResultFile) -> Result<LinkResults, String> {
    LinkResults::deserialize(&r.results).map_err(|e| format!("link results unreadable: {e}"))
}

/// The first measured pair: charts follow one pair; tables name the pair when there are more.
fn first_pair(l: &LinkResults) -> Option<[usize; 2]> {
    l.latency
        .first()
        .map(|x| x.pair)
        .or(l.bandwidth.first().map(|x| x.pair))
}

fn pair_suffix(pair: [usize; 2]) -> String {
    if pair == [0, 1] {
        String::new()
    } else {
        format!(" (ranks {}-{})", pair[0], pair[1])
    }
}

impl SuiteView for LinkView {
    fn suite(&self) -> &'static str {
        "link"
    }

    fn title(&self) -> &'static str {
        "Link: latency and bandwidth"
    }

    fn check(&self, r: &ResultFile) -> Result<(), String> {
        let l = parse(r)?;
        if l.latency.is_empty() && l.bandwidth.is_empty() {
            return Err("link result has no latency or bandwidth rows".into());
        }
        Ok(())
    }

    fn metrics(&self, r: &ResultFile) -> Vec<Metric> {
        let Ok(l) = parse(r) else { return vec![] };
        let mut out = Vec::new();
        let smallest = l.latency.iter().map(|x| x.size_bytes).min();
        for x in &l.latency {
            let subject = format!("{}{}", size_label(x.size_bytes as f64), pair_suffix(x.pair));
            // The spread of a median is the samples' interquartile range, not their stdev,
            // which a handful of scheduler hiccups would blow up.
            let spread = if x.samples_ns.is_empty() {
                x.one_way_us.stdev
            } else {
                // One-way = RTT/2 per sample, as the suite records it.
                let mut us: Vec<f64> = x.samples_ns.iter().map(|&n| n as f64 / 1e3).collect();
                median_and_half_iqr(&mut us).1
            };
            out.push(Metric::new(
                r,
                "latency p50",
                &subject,
                "us",
                Better::Lower,
                x.one_way_us.median,
                spread,
                Some(x.size_bytes) == smallest && x.pair == [0, 1],
            ));
        }
        let largest = l.bandwidth.iter().map(|x| x.size_bytes).max();
        for x in &l.bandwidth {
            let subject = format!("{}{}", size_label(x.size_bytes as f64), pair_suffix(x.pair));
            out.push(Metric::new(
                r,
                &x.mode,
                &subject,
                "Gbit/s",
                Better::Higher,
                x.gbit_per_s.avg,
                x.iteration_gbit_per_s.stdev,
                Some(x.size_bytes) == largest && x.pair == [0, 1],
            ));
        }
        out
    }

    fn section(&self, runs: &[&Loaded]) -> (String, serde_json::Value) {
        let shown = newest_per_network(runs);
        let names = series_names(&shown);
        let parsed: Vec<LinkResults> = shown
            .iter()
            .map(|r| parse(&r.result).expect("checked at load"))
            .collect();
        let mut body = String::new();
        if shown.len() > 1 {
            body.push_str(&format!(
                "<p>{} networks side by side (the newest run of each).</p>\n",
                shown.len()
            ));
        }
        let mut data_lat = Vec::new();
        let mut data_bw = Vec::new();

        // Latency: median with a p99 band, log-log.
        let mut lat_series = Vec::new();
        for (ni, (name, l)) in names.iter().zip(&parsed).enumerate() {
            let pair = first_pair(l);
            let rows: Vec<&Latency> = l.latency.iter().filter(|x| Some(x.pair) == pair).collect();
            if rows.is_empty() {
                continue;
            }
            lat_series.push(Series {
                name: name.clone(),
                points: rows
                    .iter()
                    .map(|x| (x.size_bytes as f64, x.one_way_us.median))
                    .collect(),
                band: rows
                    .iter()
                    .map(|x| (x.size_bytes as f64, x.one_way_us.median, x.one_way_us.p99))
                    .collect(),
                marks: vec![],
                colour: Some(ni),
            });
            for x in &l.latency {
                data_lat.push(json!({
                    "network": name, "pair": x.pair, "size_bytes": x.size_bytes,
                    "p50_us": x.one_way_us.median, "p99_us": x.one_way_us.p99,
                    "p999_us": x.one_way_us.p999, "min_us": x.one_way_us.min,
                    "max_us": x.one_way_us.max, "wrong_bytes": x.wrong_bytes,
                }));
            }
        }
        if !lat_series.is_empty() {
            body.push_str("<h3>One-way latency</h3>\n");
            body.push_str(&chart::line_chart(&LineChart {
                title: "One-way latency (median, band to p99) vs message size".into(),
                x_label: "message size".into(),
                y_label: "one-way latency (µs)".into(),
                x: XAxis::Bytes,
                log_y: true,
                series: lat_series,
                hlines: vec![],
            }));
            body.push_str(&percentile_table(&names, &parsed));
        }

        // Bandwidth per mode, with each network's ceiling.
        for mode in ["bw", "bibw"] {
            let mut series = Vec::new();
            let mut hlines = Vec::new();
            for (ni, (name, l)) in names.iter().zip(&parsed).enumerate() {
                let pair = first_pair(l);
                let rows: Vec<&Bandwidth> = l
                    .bandwidth
                    .iter()
                    .filter(|x| x.mode == mode && Some(x.pair) == pair)
                    .collect();
                if rows.is_empty() {
                    continue;
                }
                series.push(Series {
                    name: name.clone(),
                    points: rows
                        .iter()
                        .map(|x| (x.size_bytes as f64, x.gbit_per_s.avg))
                        .collect(),
                    colour: Some(ni),
                    ..Default::default()
                });
                // bibw is measured against twice the one-way ceiling (both directions).
                let factor = if mode == "bibw" { 2.0 } else { 1.0 };
                let ceilings: Vec<(f64, f64)> = rows
                    .iter()
                    .filter_map(|x| {
                        x.ceiling_gbit_per_s
                            .map(|c| (x.size_bytes as f64, c * factor))
                    })
                    .collect();
                let constant = ceilings
                    .windows(2)
                    .all(|w| (w[0].1 - w[1].1).abs() < 1e-9 * w[0].1.abs().max(1.0));
                if let Some(first) = ceilings.first() {
                    let source = l.ceiling_source.clone().unwrap_or_else(|| "ceiling".into());
                    if constant {
                        hlines.push((
                            format!("{name}: ceiling {:.1} Gbit/s ({source})", first.1),
                            first.1,
                        ));
                    } else {
                        series.push(Series {
                            name: format!("{name}: ceiling ({source})"),
                            points: ceilings,
                            // Past the networks' colours, so it is not mistaken for one.
                            colour: Some(names.len() + ni),
                            ..Default::default()
                        });
                    }
                }
                for x in &l.bandwidth {
                    if x.mode == mode {
                        data_bw.push(json!({
                            "network": name, "mode": mode, "pair": x.pair,
                            "size_bytes": x.size_bytes, "gbit_per_s_avg": x.gbit_per_s.avg,
                            "gbit_per_s_peak": x.gbit_per_s.peak, "gib_per_s_avg": x.gib_per_s.avg,
                            "msg_rate_per_s": x.msg_rate_per_s,
                            "percent_of_ceiling_avg": x.percent_of_ceiling.as_ref().map(|p| p.avg),
                            "ceiling_gbit_per_s": x.ceiling_gbit_per_s, "wrong_bytes": x.wrong_bytes,
                        }));
                    }
                }
            }
            if series.is_empty() {
                continue;
            }
            let title = if mode == "bw" {
                "Bandwidth, one direction (window of messages)"
            } else {
                "Bidirectional bandwidth (both directions summed)"
            };
            body.push_str(&format!("<h3>{}</h3>\n", html::escape(title)));
            body.push_str(&chart::line_chart(&LineChart {
                title: format!("{title} vs message size"),
                x_label: "message size".into(),
                y_label: "Gbit/s (average)".into(),
                x: XAxis::Bytes,
                log_y: true,
                series,
                hlines,
            }));
            body.push_str(&bandwidth_table(mode, &names, &parsed));
        }

        // The largest message every network measured, as one bar per network: the figure
        // owners quote, at one size for all (a 4 MiB bar beside a 256 MiB one compares
        // nothing).
        let common = parsed
            .iter()
            .map(|l| {
                l.bandwidth
                    .iter()
                    .filter(|x| x.mode == "bw")
                    .map(|x| x.size_bytes)
                    .collect::<Vec<u64>>()
            })
            .reduce(|a, b| a.into_iter().filter(|s| b.contains(s)).collect())
            .and_then(|sizes| sizes.into_iter().max());
        let mut cats = Vec::new();
        let mut vals = Vec::new();
        for (name, l) in names.iter().zip(&parsed) {
            if let Some(x) = l
                .bandwidth
                .iter()
                .find(|x| x.mode == "bw" && Some(x.size_bytes) == common)
            {
                cats.push(name.clone());
                vals.push(Some(x.gbit_per_s.avg));
            }
        }
        if cats.len() > 1 {
            body.push_str(&chart::bar_chart(&BarChart {
                title: format!(
                    "Bandwidth at {}, the largest message every network measured",
                    size_label(common.unwrap_or(0) as f64)
                ),
                y_label: "Gbit/s".into(),
                categories: cats,
                series: vec![("bw average".into(), vals)],
                stacked: false,
            }));
        }
        let data = json!({ "networks": names, "latency": data_lat, "bandwidth": data_bw });
        (body, data)
    }
}

/// A table with a row per message size and, per network, its `columns` under the network's
/// label; `cells` gives a network's cells at one size (its first pair's row, if it measured it).
fn size_table(
    class: &str,
    names: &[String],
    parsed: &[LinkResults],
    sizes_of: impl Fn(&LinkResults) -> Vec<u64>,
    columns: &[&str],
    cells: impl Fn(&LinkResults, u64) -> Vec<Cell>,
) -> String {
    let mut sizes: Vec<u64> = parsed.iter().flat_map(&sizes_of).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let groups: Vec<(String, Vec<&str>)> = names
        .iter()
        .map(|n| (n.clone(), columns.to_vec()))
        .collect();
    let rows = sizes
        .iter()
        .map(|&s| {
            let mut row: Vec<Cell> = vec![Cell::from(size_label(s as f64))];
            for l in parsed {
                row.extend(cells(l, s));
            }
            row
        })
        .collect();
    html::grouped_table(class, &["size"], &groups, rows)
}

fn percentile_table(names: &[String], parsed: &[LinkResults]) -> String {
    let table = size_table(
        "percentiles",
        names,
        parsed,
        |l| l.latency.iter().map(|x| x.size_bytes).collect(),
        &["p50 µs", "p99 µs", "p99.9 µs"],
        |l, s| {
            let pair = first_pair(l);
            let x = l
                .latency
                .iter()
                .find(|x| x.size_bytes == s && Some(x.pair) == pair);
            vec![
                opt_num(x.map(|x| x.one_way_us.median), 2),
                opt_num(x.map(|x| x.one_way_us.p99), 2),
                opt_num(x.and_then(|x| x.one_way_us.p999), 2),
            ]
        },
    );
    format!("<details open><summary>Latency percentiles (one-way, µs)</summary>{table}</details>\n")
}

fn bandwidth_table(mode: &str, names: &[String], parsed: &[LinkResults]) -> String {
    let table = size_table(
        &format!("bandwidth {mode}"),
        names,
        parsed,
        |l| {
            l.bandwidth
                .iter()
                .filter(|x| x.mode == mode)
                .map(|x| x.size_bytes)
                .collect()
        },
        // Each row names its own ceiling: shm's is memcpy at that size, so it changes per row.
        &["Gbit/s", "ceiling Gbit/s", "% of ceiling"],
        |l, s| {
            let pair = first_pair(l);
            let x = l
                .bandwidth
                .iter()
                .find(|x| x.mode == mode && x.size_bytes == s && Some(x.pair) == pair);
            let factor = if mode == "bibw" { 2.0 } else { 1.0 };
            vec![
                opt_num(x.map(|x| x.gbit_per_s.avg), 2),
                opt_num(x.and_then(|x| x.ceiling_gbit_per_s).map(|c| c * factor), 1),
                opt_num(
                    x.and_then(|x| x.percent_of_ceiling.as_ref().map(|p| p.avg)),
                    1,
                ),
            ]
        },
    );
    format!(
        "<details><summary>{} table (average over the window)</summary>{table}</details>\n",
        html::escape(mode)
    )
}
