//! HPL's verdict: the scaled residual, PASSED/FAILED, the flop count and the lines HPL prints.

/// Relative machine precision as HPL takes it (LAPACK's dlamch('e')): 2^-53.
pub const EPS: f64 = 1.0 / 9_007_199_254_740_992.0;

/// HPL's operation count for an N × N solve: 2/3·N³ + 3/2·N².
pub fn flops(n: usize) -> f64 {
    let n = n as f64;
    2.0 / 3.0 * n * n * n + 1.5 * n * n
}

/// ‖Ax−b‖∞ / (ε·(‖A‖∞·‖x‖∞ + ‖b‖∞)·N), from the norms each rank's pieces reduce to.
pub fn scaled_residual(r_inf: f64, a_inf: f64, x_inf: f64, b_inf: f64, n: usize) -> f64 {
    r_inf / (EPS * (a_inf * x_inf + b_inf) * n as f64)
}

/// PASSED when the residual is below the threshold (16.0, or HPL.dat's). A NaN fails.
pub fn passed(resid: f64, threshold: f64) -> bool {
    resid < threshold
}

pub const TABLE_HEADER: &str =
    "T/V                N    NB     P     Q               Time                 Gflops";

/// HPL's result line: variant code, N, NB, P, Q, seconds, Gflops.
pub fn result_line(
    code: &str,
    n: usize,
    nb: usize,
    p: usize,
    q: usize,
    seconds: f64,
    gflops: f64,
) -> String {
    format!(
        "{code:<8}{n:>12} {nb:>5} {p:>5} {q:>5} {seconds:>18.2} {:>22}",
        c_exponent(gflops, 3)
    )
}

/// C's `%.Ne`: Rust writes 5.4023e1 where HPL (and every HPL parser) expects 5.4023e+01.
fn c_exponent(v: f64, digits: usize) -> String {
    let s = format!("{v:.digits$e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = exp
                .strip_prefix('-')
                .map(|d| ('-', d))
                .unwrap_or(('+', exp));
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// HPL's residual line, ending in PASSED or FAILED.
pub fn residual_line(resid: f64, threshold: f64) -> String {
    let verdict = if passed(resid, threshold) {
        "PASSED"
    } else {
        "FAILED"
    };
    format!("||Ax-b||_oo/(eps*(||A||_oo*||x||_oo+||b||_oo)*N)= {resid:>16.7} ...... {verdict}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flop_count_is_hpls() {
        assert_eq!(flops(1000), 2.0 / 3.0 * 1e9 + 1.5e6);
    }

    #[test]
    fn residual_verdicts() {
        assert!(passed(scaled_residual(1e-12, 10.0, 1.0, 1.0, 1000), 16.0));
        // A wrong solution leaves a residual of the matrix's own size: FAILED.
        let resid = scaled_residual(0.3, 10.0, 1.0, 1.0, 1000);
        assert!(!passed(resid, 16.0));
        assert!(residual_line(resid, 16.0).ends_with("FAILED"));
        assert!(!passed(f64::NAN, 16.0));
    }

    #[test]
    fn lines_match_what_netlib_hpl_prints() {
        // Lines from Debian's hpcc 1.5 (netlib HPL inside), N=200 NB=8 on 1x1, this machine.
        let hpl_result =
            "WR11C2R4         200     8     1     1               0.00              1.474e+01";
        let hpl_resid =
            "||Ax-b||_oo/(eps*(||A||_oo*||x||_oo+||b||_oo)*N)=        0.0067442 ...... PASSED";
        assert_eq!(
            result_line("WR11C2R4", 200, 8, 1, 1, 0.0012, 14.74),
            hpl_result
        );
        assert_eq!(residual_line(0.0067442, 16.0), hpl_resid);
        assert_eq!(hpl_result.len(), TABLE_HEADER.len());
        assert_eq!(c_exponent(0.00012345, 3), "1.234e-04");
    }
}
