//! Sizes and rates as users type them: `256MiB`, `1GiB`, `64k`, `4096`, `80Gbit`.
//!
//! Binary prefixes (KiB/MiB/GiB and the short k/m/g, K/M/G) are powers of two, as perftest and
//! OSU take them; decimal KB/MB/GB are powers of ten. Rates are bits per second with decimal
//! prefixes (Gbit/s = 10^9 bit/s), as link speeds are quoted.

use anyhow::{bail, Result};

/// Parses a byte size. Rejects zero, negatives, fractions of a byte and junk with one line.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "k" | "K" | "KiB" | "Ki" | "kiB" => 1 << 10,
        "m" | "M" | "MiB" | "Mi" => 1 << 20,
        "g" | "G" | "GiB" | "Gi" => 1 << 30,
        "t" | "T" | "TiB" | "Ti" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => bail!(
            "bad size '{text}': unknown unit '{other}' (use B, KiB, MiB, GiB, k, m, g, KB, MB, GB)"
        ),
    };
    if num.is_empty() {
        bail!("bad size '{text}': expected a number such as 4096, 64k, 256MiB or 1GiB");
    }
    if num.matches('.').count() > 1 {
        bail!("bad size '{text}': '{num}' is not a number");
    }
    let value: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("bad size '{text}': '{num}' is not a number"))?;
    let bytes = value * mult as f64;
    if bytes < 1.0 {
        bail!("bad size '{text}': a message must be at least 1 byte");
    }
    if bytes.fract() != 0.0 {
        bail!("bad size '{text}': not a whole number of bytes");
    }
    if bytes > (1u64 << 50) as f64 {
        bail!("bad size '{text}': larger than 1 PiB");
    }
    Ok(bytes as u64)
}

/// Parses a list of sizes: `1B..256MiB` (every power of two in between, ends included when
/// they are powers of two), or a comma list `64,4k,1MiB`, or one size.
pub fn parse_size_list(text: &str) -> Result<Vec<u64>> {
    let t = text.trim();
    if let Some((lo, hi)) = t.split_once("..") {
        let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
        if lo > hi {
            bail!("bad size range '{text}': {lo} is larger than {hi}");
        }
        let mut sizes = Vec::new();
        let mut s = lo.next_power_of_two();
        if s != lo {
            sizes.push(lo);
        }
        while s <= hi {
            sizes.push(s);
            s *= 2;
        }
        if *sizes.last().unwrap_or(&0) != hi {
            sizes.push(hi);
        }
        return Ok(sizes);
    }
    let sizes = t.split(',').map(parse_size).collect::<Result<Vec<_>>>()?;
    Ok(sizes)
}

/// Parses a link rate into bit/s: `80Gbit`, `80Gbit/s`, `2500mbit`, `10G`, `8.65GiB/s`.
pub fn parse_rate_bits(text: &str) -> Result<f64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        anyhow::anyhow!("bad rate '{text}': expected e.g. 80Gbit, 10Gbit/s, 2500Mbit")
    })?;
    // A capital B means bytes (GB/s, GiB/s); bit, b or a bare prefix means bits (Gbit, Gb,
    // 10G), as link speeds are quoted. Case matters only there.
    let unit = unit.trim().trim_end_matches("/s");
    let (prefix, bytes) = if let Some(p) = unit
        .strip_suffix("bit")
        .or_else(|| unit.strip_suffix("bps"))
    {
        (p, false)
    } else if let Some(p) = unit.strip_suffix('B') {
        (p, true)
    } else if let Some(p) = unit.strip_suffix('b') {
        (p, false)
    } else {
        (unit, false)
    };
    let scale = match prefix {
        "" => 1.0,
        "k" | "K" => 1e3,
        "m" | "M" => 1e6,
        "g" | "G" => 1e9,
        "t" | "T" => 1e12,
        "Ki" => (1u64 << 10) as f64,
        "Mi" => (1u64 << 20) as f64,
        "Gi" => (1u64 << 30) as f64,
        "Ti" => (1u64 << 40) as f64,
        _ => bail!("bad rate '{text}': unknown unit '{unit}' (use Gbit, Mbit, GB/s, GiB/s)"),
    };
    let bits = value * scale * if bytes { 8.0 } else { 1.0 };
    if !(bits > 0.0 && bits.is_finite()) {
        bail!("bad rate '{text}': must be above zero");
    }
    Ok(bits)
}

/// Formats a byte count the way the tables print it: 64B, 4KiB, 256MiB, 1.5MiB.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, unit) in UNITS {
        if bytes >= unit {
            return if bytes.is_multiple_of(unit) {
                format!("{}{name}", bytes / unit)
            } else {
                format!("{:.1}{name}", bytes as f64 / unit as f64)
            };
        }
    }
    format!("{bytes}B")
}

/// Parses a duration in seconds: `30`, `30s`, `500ms`, `2m`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("bad duration '{text}': expected e.g. 30s, 500ms, 2m"))?;
    if !(v > 0.0 && v.is_finite()) {
        bail!("bad duration '{text}': must be above zero");
    }
    // Deadlines are `Instant::now() + duration`: a bound keeps that sum representable, and no
    // wait of tbbench's is meant to last longer.
    let secs = v * scale;
    if secs > MAX_DURATION_S {
        bail!("bad duration '{text}': at most 7 days (604800 s)");
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// The longest duration a flag takes.
pub const MAX_DURATION_S: f64 = 7.0 * 24.0 * 3600.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_binary_and_decimal_prefixes() {
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1B").unwrap(), 1);
        assert_eq!(parse_size("1.5MiB").unwrap(), 3 << 19);
        assert_eq!(parse_size("10MB").unwrap(), 10_000_000);
    }

    #[test]
    fn nonsense_sizes_get_one_line_errors() {
        for bad in ["abc", "0", "-1", "1.5.3MiB", "", "12XB", "0.3B", "MiB"] {
            let err = parse_size(bad).unwrap_err().to_string();
            assert!(err.starts_with("bad size"), "{bad}: {err}");
            assert!(!err.contains('\n'), "{bad}: {err}");
        }
    }

    #[test]
    fn size_ranges_step_by_powers_of_two() {
        let s = parse_size_list("1B..16").unwrap();
        assert_eq!(s, vec![1, 2, 4, 8, 16]);
        let s = parse_size_list("3..10").unwrap();
        assert_eq!(s, vec![3, 4, 8, 10]);
        assert_eq!(
            parse_size_list("64,4k,1MiB").unwrap(),
            vec![64, 4096, 1 << 20]
        );
        assert!(parse_size_list("1MiB..1k").is_err());
    }

    #[test]
    fn rates_are_bits_per_second() {
        assert_eq!(parse_rate_bits("80Gbit").unwrap(), 80e9);
        assert_eq!(parse_rate_bits("2500mbit").unwrap(), 2.5e9);
        assert_eq!(parse_rate_bits("10Gbit/s").unwrap(), 10e9);
        assert!(parse_rate_bits("fast").is_err());
        assert_eq!(parse_rate_bits("10GB/s").unwrap(), 80e9, "GB is bytes");
        assert_eq!(parse_rate_bits("10Gb").unwrap(), 10e9, "Gb is bits");
        assert_eq!(
            parse_rate_bits("8.65GiB/s").unwrap(),
            8.65 * 8.0 * (1u64 << 30) as f64
        );
        assert_eq!(parse_rate_bits("10G").unwrap(), 10e9);
        assert_eq!(parse_rate_bits("100mbps").unwrap(), 1e8);
        assert!(parse_rate_bits("0Gbit").is_err());
    }

    #[test]
    fn sizes_format_compactly() {
        assert_eq!(format_size(64), "64B");
        assert_eq!(format_size(4096), "4KiB");
        assert_eq!(format_size(256 << 20), "256MiB");
        assert_eq!(format_size(3 << 19), "1.5MiB");
    }

    #[test]
    fn durations_parse_units() {
        assert_eq!(parse_duration("30").unwrap().as_secs(), 30);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert!(parse_duration("soon").is_err());
        for huge in ["1e19", "1e20", "1e300m", "604801"] {
            let err = parse_duration(huge).unwrap_err().to_string();
            assert!(err.contains("at most 7 days"), "{huge}: {err}");
        }
        for bad in ["NaN", "inf", "-1s", "0"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
