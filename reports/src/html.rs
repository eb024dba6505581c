//! HTML building blocks for the report: escaping, tables, the page around the sections.
//! Every string from a result file passes through [`escape`] before it reaches the page.

/// Escapes text for HTML content and double-quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A table cell: text is escaped; `Html` is trusted markup (such as [`verdict`]'s), never text
/// from a result file.
pub enum Cell {
    Text(String),
    Num(String),
    Html(String),
}

impl From<&str> for Cell {
    fn from(s: &str) -> Self {
        Cell::Text(s.to_string())
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Self {
        Cell::Text(s)
    }
}

pub fn num(v: f64, decimals: usize) -> Cell {
    if v.is_finite() {
        Cell::Num(format!("{v:.decimals$}"))
    } else {
        Cell::Num("–".into())
    }
}

pub fn opt_num(v: Option<f64>, decimals: usize) -> Cell {
    v.map(|v| num(v, decimals))
        .unwrap_or_else(|| Cell::Num("–".into()))
}

/// A PASSED/FAILED badge, large enough to see from across the room.
pub fn verdict(passed: bool) -> Cell {
    if passed {
        Cell::Html("<span class=\"pass\">PASSED</span>".into())
    } else {
        Cell::Html("<span class=\"fail\">FAILED</span>".into())
    }
}

pub fn table(class: &str, headers: &[&str], rows: Vec<Vec<Cell>>) -> String {
    let mut s = format!("<table class=\"{class}\"><thead><tr>");
    for h in headers {
        s.push_str(&format!("<th>{}</th>", escape(h)));
    }
    s.push_str("</tr></thead><tbody>\n");
    body_rows(&mut s, rows);
    s.push_str("</tbody></table>\n");
    s
}

/// A table whose columns come in groups under a shared heading (a network's label over its
/// p50/p99/p99.9 columns): `lead` columns first (each spanning both header rows), then each
/// group's heading over its columns. Long labels are written once instead of per column.
pub fn grouped_table(
    class: &str,
    lead: &[&str],
    groups: &[(String, Vec<&str>)],
    rows: Vec<Vec<Cell>>,
) -> String {
    let mut s = format!("<table class=\"{class}\"><thead><tr>");
    for h in lead {
        s.push_str(&format!("<th rowspan=\"2\">{}</th>", escape(h)));
    }
    for (g, cols) in groups {
        s.push_str(&format!(
            "<th class=\"group\" colspan=\"{}\">{}</th>",
            cols.len(),
            escape(g)
        ));
    }
    s.push_str("</tr><tr>");
    for (_, cols) in groups {
        for c in cols {
            s.push_str(&format!("<th>{}</th>", escape(c)));
        }
    }
    s.push_str("</tr></thead><tbody>\n");
    body_rows(&mut s, rows);
    s.push_str("</tbody></table>\n");
    s
}

fn body_rows(s: &mut String, rows: Vec<Vec<Cell>>) {
    for row in rows {
        s.push_str("<tr>");
        for c in row {
            match c {
                Cell::Text(t) => s.push_str(&format!("<td>{}</td>", escape(&t))),
                Cell::Num(t) => s.push_str(&format!("<td class=\"n\">{}</td>", escape(&t))),
                Cell::Html(h) => s.push_str(&format!("<td>{h}</td>")),
            }
        }
        s.push_str("</tr>\n");
    }
}

pub fn section(id: &str, title: &str, body: &str) -> String {
    format!(
        "<section id=\"{}\"><h2>{}</h2>\n{body}</section>\n",
        escape(id),
        escape(title)
    )
}

const CSS: &str = "
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1180px;padding:1rem 2rem;color:#222;background:#fff}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{border-bottom:2px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
h3{margin-top:1.6rem}
table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.86rem;display:block;max-width:100%;overflow-x:auto}
th,td{border:1px solid #ddd;padding:.25rem .45rem;text-align:left;vertical-align:top}
td{overflow-wrap:anywhere}th{background:#f4f4f4;overflow-wrap:normal}th.group{text-align:center}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.pass,.fail{white-space:nowrap}
.pass{background:#1a7f37;color:#fff;font-weight:700;padding:.1rem .5rem;border-radius:3px}
.fail{background:#cf222e;color:#fff;font-weight:700;padding:.1rem .5rem;border-radius:3px}
.regressed{color:#cf222e;font-weight:700}.improved{color:#1a7f37}
.warn{color:#9a6700}.problems li{color:#cf222e}
figure.chart{margin:1rem 1rem 1rem 0;display:inline-block;vertical-align:top;max-width:760px}
figure.chart svg{max-width:100%;height:auto;border:1px solid #eee}
figcaption.legend{font-size:.82rem;color:#333;display:flex;flex-wrap:wrap;gap:.15rem 1.1rem;margin-top:.3rem}
figcaption.legend .key{display:inline-flex;align-items:center;gap:.35rem}
figcaption.legend svg{border:none}
div.topology{display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;align-items:flex-start}
figure.topology{margin:.5rem 0}figure.topology svg{max-width:100%;height:auto;border:1px solid #eee}
table.heat caption{font-weight:600;text-align:left;padding-bottom:.2rem}
figure.values{margin:1rem 0}figure.values figcaption{font-weight:600;margin-bottom:.2rem}
.meta{color:#555;font-size:.9rem}
details summary{cursor:pointer}
";

pub fn page(title: &str, subtitle: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t}</title><style>{CSS}</style></head>\n<body>\n<h1>{t}</h1>\n\
         <p class=\"meta\">{s}</p>\n{body}</body></html>\n",
        t = escape(title),
        s = escape(subtitle),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_strings_come_out_as_text() {
        let t = table(
            "t",
            &["host"],
            vec![vec![Cell::from("<script>alert(1)</script>")]],
        );
        assert!(t.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{t}");
        assert!(!t.contains("<script>"));
        assert_eq!(escape("a\"b'c&"), "a&quot;b&#39;c&amp;");
    }
}
