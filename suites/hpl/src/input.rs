//! netlib HPL's input file, HPL.dat: the same 31 lines, read the way HPL reads them (the
//! first words of each line; the rest is comment), every combination it lists enumerated in
//! HPL's order, and the variant code HPL prints (`WR11C2R4`).

use crate::grid::{Grid, ProcessMap};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::Path;

/// HPL's own limit on each list (MAXNS etc.).
const MAX_LIST: usize = 20;
/// The largest N tbbench solves: a matrix of 800 TB, beyond any cluster it is for, and small
/// enough that every size derived from N fits in 64 bits.
pub const MAX_N: usize = 10_000_000;
/// The largest block size (HPL's own inputs stay far below it).
pub const MAX_NB: usize = 4096;
/// The most ranks a grid may have: the launcher's own limit.
const MAX_GRID: i64 = 1024;
/// The deepest lookahead, as `--depth` takes it.
const MAX_DEPTH: i64 = 64;
/// The most combinations one HPL.dat may ask for: netlib's sample asks for 864; twenty values
/// on every list would be 20^9, each a run (and a record held in memory).
pub const MAX_COMBINATIONS: u64 = 100_000;

/// Left-looking, Crout or right-looking, for the panel (PFACT) and its recursion (RFACT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Factorization {
    Left,
    Crout,
    Right,
}

impl Factorization {
    fn from_code(c: i64) -> Option<Self> {
        match c {
            0 => Some(Factorization::Left),
            1 => Some(Factorization::Crout),
            2 => Some(Factorization::Right),
            _ => None,
        }
    }
    pub fn letter(&self) -> char {
        match self {
            Factorization::Left => 'L',
            Factorization::Crout => 'C',
            Factorization::Right => 'R',
        }
    }
}

/// The panel broadcasts HPL offers, by their HPL.dat codes 0..5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Broadcast {
    /// 0: increasing ring.
    IncreasingRing,
    /// 1: increasing ring, modified.
    IncreasingRingModified,
    /// 2: increasing 2-ring.
    IncreasingTwoRing,
    /// 3: increasing 2-ring, modified.
    IncreasingTwoRingModified,
    /// 4: long (bandwidth-reducing).
    Long,
    /// 5: long, modified.
    LongModified,
}

impl Broadcast {
    /// The variant a process row cabled only between neighbours (round a ring) runs: the
    /// increasing ring (modified where the variant is), since 2ring's root and Long's
    /// spreading send to members that are not its neighbours.
    pub fn round_the_ring(self) -> Broadcast {
        match self {
            Broadcast::IncreasingTwoRing | Broadcast::Long => Broadcast::IncreasingRing,
            Broadcast::IncreasingTwoRingModified | Broadcast::LongModified => {
                Broadcast::IncreasingRingModified
            }
            ring => ring,
        }
    }
}

impl Broadcast {
    fn from_code(c: i64) -> Option<Self> {
        Some(match c {
            0 => Broadcast::IncreasingRing,
            1 => Broadcast::IncreasingRingModified,
            2 => Broadcast::IncreasingTwoRing,
            3 => Broadcast::IncreasingTwoRingModified,
            4 => Broadcast::Long,
            5 => Broadcast::LongModified,
            _ => return None,
        })
    }
    pub fn code(&self) -> u8 {
        *self as u8
    }
}

/// How pivot rows are exchanged (HPL's SWAP line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Swap {
    BinaryExchange,
    Long,
    /// Binary exchange below the threshold (in columns), long above.
    Mix {
        threshold: usize,
    },
}

/// Everything an HPL.dat file says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HplDat {
    pub output_file: String,
    pub device_out: i64,
    pub ns: Vec<usize>,
    pub nbs: Vec<usize>,
    pub pmap: ProcessMap,
    pub grids: Vec<(usize, usize)>,
    pub threshold: f64,
    pub pfacts: Vec<Factorization>,
    pub nbmins: Vec<usize>,
    pub ndivs: Vec<usize>,
    pub rfacts: Vec<Factorization>,
    pub bcasts: Vec<Broadcast>,
    pub depths: Vec<usize>,
    pub swap: Swap,
    /// L1 stored transposed (HPL's 0) or not (1).
    pub l1_transposed: bool,
    pub u_transposed: bool,
    pub equilibration: bool,
    pub alignment: usize,
}

/// HPL.dat's algorithm choices for one run: what the factorization itself needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Algorithm {
    pub pfact: Factorization,
    pub nbmin: usize,
    pub ndiv: usize,
    pub rfact: Factorization,
    pub bcast: Broadcast,
    /// HPL's lookahead: how many panels are factored ahead of the trailing update.
    pub depth: usize,
    pub swap: Swap,
}

/// One run: a single combination of everything HPL.dat lists.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Variant {
    pub n: usize,
    pub nb: usize,
    pub grid: Grid,
    #[serde(flatten)]
    pub algo: Algorithm,
    pub threshold: f64,
}

impl Variant {
    /// The run a plain `--n`/`--nb` asks for: what tbbench implements, with HPL's usual
    /// NBMIN 4 and NDIV 2, threshold 16, and [`Variant::default_depth`].
    pub fn plain(n: usize, nb: usize, grid: Grid) -> Variant {
        let depth = Variant::default_depth(&grid);
        Variant {
            n,
            nb,
            grid,
            algo: Algorithm {
                pfact: Factorization::Right,
                nbmin: 4,
                ndiv: 2,
                rfact: Factorization::Right,
                bcast: Broadcast::IncreasingRing,
                depth,
                swap: Swap::Mix { threshold: 64 },
            },
            threshold: 16.0,
        }
    }

    /// The lookahead `--n` runs use: DEPTH 1 where there is a panel broadcast for it to hide
    /// (more than one process column; measured faster on 1x2), and on one rank, where the
    /// panel is factored on one of the rank's threads while the others update (`factor`;
    /// with one thread it only reorders the update). With several process rows in one
    /// column it could only reorder the update, so it stays off.
    pub fn default_depth(grid: &Grid) -> usize {
        usize::from(grid.q > 1 || grid.p == 1)
    }

    /// HPL's T/V code: W, the process map, depth, broadcast, RFACT, NDIV, PFACT, NBMIN.
    pub fn code(&self) -> String {
        let map = match self.grid.map {
            ProcessMap::RowMajor => 'R',
            ProcessMap::ColumnMajor => 'C',
            ProcessMap::Snake => 'S',
        };
        let a = &self.algo;
        format!(
            "W{map}{}{}{}{}{}{}",
            a.depth,
            a.bcast.code(),
            a.rfact.letter(),
            a.ndiv,
            a.pfact.letter(),
            a.nbmin
        )
    }
}

impl HplDat {
    pub fn read(path: &Path) -> Result<HplDat> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        HplDat::parse(&text).with_context(|| format!("bad HPL.dat {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<HplDat> {
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() < 31 {
            bail!(
                "{} lines, HPL.dat has 31 (is the file cut short?)",
                lines.len()
            );
        }
        let r = Reader { lines: &lines };
        let ns = r.list(4, 5, "problem sizes (N)", |n| {
            (1..=MAX_N as i64).contains(&n)
        })?;
        let nbs = r.list(6, 7, "block sizes (NB)", |nb| {
            (1..=MAX_NB as i64).contains(&nb)
        })?;
        let pmap = match r.int(8, "PMAP process mapping")? {
            0 => ProcessMap::RowMajor,
            1 => ProcessMap::ColumnMajor,
            v => bail!("line 9: PMAP must be 0 (row-major) or 1 (column-major), not {v}"),
        };
        let ps = r.list(9, 10, "process grids (P)", |p| (1..=MAX_GRID).contains(&p))?;
        let qs = r.list_n(ps.len(), 11, "Qs", |q| (1..=MAX_GRID).contains(&q))?;
        if let Some((p, q)) = ps.iter().zip(&qs).find(|(p, q)| **p * **q > MAX_GRID) {
            bail!("lines 11-12: a {p}x{q} grid has more than {MAX_GRID} ranks");
        }
        let threshold = r.float(12, "threshold")?;
        if !threshold.is_finite() {
            bail!("line 13: threshold must be a finite number, not {threshold}");
        }
        let pfacts = r.list(13, 14, "panel factorizations (PFACT)", |c| {
            (0..=2).contains(&c)
        })?;
        let nbmins = r.list(15, 16, "recursive stopping criteria (NBMIN)", |v| {
            (1..=MAX_NB as i64).contains(&v)
        })?;
        let ndivs = r.list(17, 18, "panels in recursion (NDIV)", |v| {
            (2..=MAX_NB as i64).contains(&v)
        })?;
        let rfacts = r.list(19, 20, "recursive panel factorizations (RFACT)", |c| {
            (0..=2).contains(&c)
        })?;
        let bcasts = r.list(21, 22, "broadcasts (BCAST)", |c| (0..=5).contains(&c))?;
        let depths = r.list(23, 24, "lookahead depths (DEPTH)", |d| {
            (0..=MAX_DEPTH).contains(&d)
        })?;
        // Counted before `variants` lists them.
        let combinations = [
            ps.len(),
            ns.len(),
            nbs.len(),
            depths.len(),
            bcasts.len(),
            rfacts.len(),
            nbmins.len(),
            ndivs.len(),
            pfacts.len(),
        ]
        .iter()
        .fold(1u64, |t, &n| t.saturating_mul(n as u64));
        if combinations > MAX_COMBINATIONS {
            bail!(
                "its lists make {combinations} combinations, each a run; at most {MAX_COMBINATIONS} (shorten the lists)"
            );
        }
        let swap = match r.int(25, "SWAP")? {
            0 => Swap::BinaryExchange,
            1 => Swap::Long,
            2 => Swap::Mix {
                threshold: r.int(26, "swapping threshold")?.max(0) as usize,
            },
            v => bail!("line 26: SWAP must be 0 (bin-exch), 1 (long) or 2 (mix), not {v}"),
        };
        let flag = |line: usize, what: &str| -> Result<bool> {
            match r.int(line, what)? {
                0 => Ok(false),
                1 => Ok(true),
                v => bail!("line {}: {what} must be 0 or 1, not {v}", line + 1),
            }
        };
        let fact = |v: Vec<i64>| {
            v.into_iter()
                .filter_map(Factorization::from_code)
                .collect::<Vec<_>>()
        };
        Ok(HplDat {
            output_file: r.word(2)?.to_string(),
            device_out: r.int(3, "device out")?,
            ns: ns.into_iter().map(|v| v as usize).collect(),
            nbs: nbs.into_iter().map(|v| v as usize).collect(),
            pmap,
            grids: ps
                .into_iter()
                .zip(qs)
                .map(|(p, q)| (p as usize, q as usize))
                .collect(),
            threshold,
            pfacts: fact(pfacts),
            nbmins: nbmins.into_iter().map(|v| v as usize).collect(),
            ndivs: ndivs.into_iter().map(|v| v as usize).collect(),
            rfacts: fact(rfacts),
            bcasts: bcasts
                .into_iter()
                .filter_map(Broadcast::from_code)
                .collect(),
            depths: depths.into_iter().map(|v| v as usize).collect(),
            swap,
            // HPL.dat says 0 for transposed, 1 for not.
            l1_transposed: !flag(27, "L1 form")?,
            u_transposed: !flag(28, "U form")?,
            equilibration: flag(29, "Equilibration")?,
            alignment: r.int(30, "memory alignment")?.max(1) as usize,
        })
    }

    /// What the file's last four lines ask for that tbbench does differently, each named (none
    /// of them changes the system solved or the check, only HPL's memory layout and the
    /// balance of its long swap).
    pub fn storage_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.l1_transposed {
            notes.push("HPL.dat line 28 asks for L1 in transposed form: tbbench keeps L1 as factored (no-transposed); a storage layout, the solve is the same".to_string());
        }
        if self.u_transposed {
            notes.push("HPL.dat line 29 asks for U in transposed form: tbbench keeps U12 column by column (no-transposed); a storage layout, the solve is the same".to_string());
        }
        if self.equilibration {
            notes.push("HPL.dat line 30 asks for equilibration: it balances HPL's spread-and-roll long swap, which tbbench replaces by one gather and one scatter; not applied".to_string());
        }
        if self.alignment > 2 {
            notes.push(format!("HPL.dat line 31 asks for memory aligned to {} doubles: tbbench's shares come from the system allocator (16-byte aligned)", self.alignment));
        }
        notes
    }

    /// Every run the file asks for, in netlib HPL's loop order (grids outermost, then N, NB,
    /// DEPTH, BCAST, RFACT, NBMIN, NDIV, PFACT).
    pub fn variants(&self) -> Vec<Variant> {
        let mut out = Vec::new();
        for &(p, q) in &self.grids {
            let grid = Grid {
                p,
                q,
                map: self.pmap,
                order: None,
            };
            for &n in &self.ns {
                for &nb in &self.nbs {
                    for &depth in &self.depths {
                        for &bcast in &self.bcasts {
                            for &rfact in &self.rfacts {
                                for &nbmin in &self.nbmins {
                                    for &ndiv in &self.ndivs {
                                        for &pfact in &self.pfacts {
                                            out.push(Variant {
                                                n,
                                                nb,
                                                grid: grid.clone(),
                                                algo: Algorithm {
                                                    pfact,
                                                    nbmin,
                                                    ndiv,
                                                    rfact,
                                                    bcast,
                                                    depth,
                                                    swap: self.swap,
                                                },
                                                threshold: self.threshold,
                                            });
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// Reads HPL.dat's lines by 0-based index; errors say the 1-based line number.
struct Reader<'a> {
    lines: &'a [&'a str],
}

impl Reader<'_> {
    fn word(&self, line: usize) -> Result<&str> {
        self.lines[line]
            .split_whitespace()
            .next()
            .with_context(|| format!("line {} is empty", line + 1))
    }

    fn int(&self, line: usize, what: &str) -> Result<i64> {
        let w = self.word(line)?;
        w.parse().map_err(|_| {
            anyhow::anyhow!(
                "line {}: {what} must be a whole number, not '{w}'",
                line + 1
            )
        })
    }

    fn float(&self, line: usize, what: &str) -> Result<f64> {
        let w = self.word(line)?;
        w.parse()
            .map_err(|_| anyhow::anyhow!("line {}: {what} must be a number, not '{w}'", line + 1))
    }

    /// A count on `count_line`, then that many values on `values_line`.
    fn list(
        &self,
        count_line: usize,
        values_line: usize,
        what: &str,
        ok: impl Fn(i64) -> bool,
    ) -> Result<Vec<i64>> {
        let n = self.int(count_line, &format!("the number of {what}"))?;
        if n < 1 || n as usize > MAX_LIST {
            bail!(
                "line {}: the number of {what} must be 1 to {MAX_LIST}, not {n}",
                count_line + 1
            );
        }
        self.list_n(n as usize, values_line, what, ok)
    }

    fn list_n(
        &self,
        n: usize,
        line: usize,
        what: &str,
        ok: impl Fn(i64) -> bool,
    ) -> Result<Vec<i64>> {
        // Values come first; the words after them are HPL.dat's comment.
        let given = self.lines[line]
            .split_whitespace()
            .take_while(|w| w.parse::<f64>().is_ok())
            .count();
        let words: Vec<&str> = self.lines[line].split_whitespace().take(n).collect();
        if given < n {
            bail!("line {}: {n} {what} announced, {given} given", line + 1);
        }
        words
            .into_iter()
            .map(|w| match w.parse::<i64>() {
                Ok(v) if ok(v) => Ok(v),
                Ok(v) => bail!("line {}: {v} is not a valid value for {what}", line + 1),
                Err(_) => bail!("line {}: {what} must be whole numbers, not '{w}'", line + 1),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/netlib-HPL.dat"
        ))
        .unwrap()
    }

    #[test]
    fn netlibs_sample_file_reads_whole() {
        let d = HplDat::parse(&sample()).unwrap();
        assert_eq!(d.output_file, "HPL.out");
        assert_eq!(d.device_out, 6);
        assert_eq!(d.ns, vec![29, 30, 34, 35]);
        assert_eq!(d.nbs, vec![1, 2, 3, 4]);
        assert_eq!(d.pmap, ProcessMap::RowMajor);
        assert_eq!(d.grids, vec![(2, 2), (1, 4), (4, 1)]);
        assert_eq!(d.threshold, 16.0);
        assert_eq!(
            d.pfacts,
            vec![
                Factorization::Left,
                Factorization::Crout,
                Factorization::Right
            ]
        );
        assert_eq!(d.nbmins, vec![2, 4]);
        assert_eq!(d.ndivs, vec![2]);
        assert_eq!(d.rfacts.len(), 3);
        assert_eq!(d.bcasts, vec![Broadcast::IncreasingRing]);
        assert_eq!(d.depths, vec![0]);
        assert_eq!(d.swap, Swap::Mix { threshold: 64 });
        assert!(d.l1_transposed && d.u_transposed && d.equilibration);
        assert_eq!(d.alignment, 8);
        let notes = d.storage_notes();
        assert_eq!(notes.len(), 4, "{notes:?}");
        assert!(notes[0].starts_with("HPL.dat line 28 asks for L1 in transposed form"));
        // 3 grids x 4 N x 4 NB x 1 depth x 1 bcast x 3 RFACT x 2 NBMIN x 1 NDIV x 3 PFACT.
        let v = d.variants();
        assert_eq!(v.len(), 3 * 4 * 4 * 3 * 2 * 3);
        assert_eq!(v[0].code(), "WR00L2L2");
        assert_eq!((v[0].n, v[0].nb, v[0].grid.p, v[0].grid.q), (29, 1, 2, 2));
        assert_eq!(v[1].code(), "WR00L2C2", "PFACT varies fastest");
        assert_eq!(v.last().unwrap().code(), "WR00R2R4");
    }

    #[test]
    fn plain_runs_look_ahead_with_a_broadcast_or_a_panel_to_hide() {
        let grid = |p, q| Grid::new(p, q, ProcessMap::RowMajor);
        assert_eq!(Variant::plain(8000, 192, grid(1, 2)).code(), "WR10R2R4");
        assert_eq!(Variant::plain(8000, 192, grid(2, 2)).algo.depth, 1);
        assert_eq!(Variant::plain(8000, 192, grid(1, 1)).code(), "WR10R2R4");
        assert_eq!(Variant::plain(8000, 192, grid(4, 1)).algo.depth, 0);
    }

    #[test]
    fn variant_codes_read_as_hpl_prints_them() {
        let mut d = HplDat::parse(&sample()).unwrap();
        d.depths = vec![1];
        d.bcasts = vec![Broadcast::IncreasingRingModified];
        d.rfacts = vec![Factorization::Crout];
        d.pfacts = vec![Factorization::Right];
        d.nbmins = vec![4];
        assert_eq!(d.variants()[0].code(), "WR11C2R4");
    }

    fn broken(line: usize, replacement: &str) -> String {
        let text = sample();
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        lines[line - 1] = replacement.to_string();
        lines.join("\n")
    }

    #[test]
    fn twenty_values_on_every_list_are_refused_before_listing_them() {
        let mut lines: Vec<String> = sample().lines().map(String::from).collect();
        let twenty = |v: &str| vec![v; 20].join(" ");
        for (count, values, v) in [
            (5, 6, "1000"),
            (7, 8, "64"),
            (10, 11, "1"),
            (14, 15, "1"),
            (16, 17, "4"),
            (18, 19, "2"),
            (20, 21, "1"),
            (22, 23, "1"),
            (24, 25, "1"),
        ] {
            lines[count - 1] = "20 count".into();
            lines[values - 1] = twenty(v);
        }
        lines[11] = twenty("1");
        let err = format!("{:#}", HplDat::parse(&lines.join("\n")).unwrap_err());
        assert!(
            err.contains("combinations") && err.contains("at most"),
            "{err}"
        );
    }

    #[test]
    fn malformed_files_name_the_line_and_the_problem() {
        let cases = [
            (broken(5, "x            # of problems sizes (N)"), "line 5"),
            (
                broken(6, "29 30        Ns"),
                "line 6: 4 problem sizes (N) announced, 2 given",
            ),
            (
                broken(8, "1 0 3 4      NBs"),
                "line 8: 0 is not a valid value for block sizes",
            ),
            (broken(9, "2            PMAP"), "line 9: PMAP"),
            (
                broken(12, "2 4          Qs"),
                "line 12: 3 Qs announced, 2 given",
            ),
            (broken(15, "0 1 7        PFACTs"), "line 15"),
            (broken(23, "9            BCASTs"), "line 23"),
            (broken(26, "3            SWAP"), "line 26"),
            (broken(13, "sixteen      threshold"), "line 13: threshold"),
            (broken(5, "21           # of problems sizes (N)"), "1 to 20"),
            (
                broken(6, "0 1000 2000 3000 Ns"),
                "line 6: 0 is not a valid value for problem sizes",
            ),
            (
                broken(12, "4611686018427387905 4 4 Qs"),
                "line 12: 4611686018427387905 is not a valid value for Qs",
            ),
            (broken(13, "NaN          threshold"), "line 13: threshold"),
            (broken(13, "inf          threshold"), "line 13: threshold"),
            (
                "HPLinpack benchmark input file\nonly two lines".to_string(),
                "2 lines",
            ),
        ];
        for (text, want) in cases {
            let err = format!("{:#}", HplDat::parse(&text).unwrap_err());
            assert!(err.contains(want), "want '{want}' in: {err}");
            assert!(!err.contains('\n'));
        }
    }
}
