//! One rank's share of the N × (N+1) matrix [A | b]: its blocks of the 2D block-cyclic
//! distribution, stored column-major, generated in place (no rank ever holds the whole).

use crate::generator;
use crate::grid::{local_to_global, numroc, Grid};

/// Where one rank's share sits in the distribution: everything about it but its numbers, so
/// code handed only part of the share (a panel's columns) can still place it.
#[derive(Debug, Clone)]
pub struct Layout {
    pub n: usize,
    pub nb: usize,
    pub grid: Grid,
    pub myrow: usize,
    pub mycol: usize,
    /// Local rows and columns (the columns include b's, global column n).
    pub mp: usize,
    pub nq: usize,
    /// Leading dimension: at least 1, so empty shares still index safely.
    pub lda: usize,
}

pub struct LocalMatrix {
    pub layout: Layout,
    pub a: Vec<f64>,
}

/// The share's numbers are read and written through `a`; its shape through the layout, as if
/// its fields were the matrix's own (`m.nb`, `m.rows_before(g)`).
impl std::ops::Deref for LocalMatrix {
    type Target = Layout;
    fn deref(&self) -> &Layout {
        &self.layout
    }
}

impl LocalMatrix {
    /// Bytes one rank at (myrow, mycol) needs for its share, before allocating it.
    pub fn bytes(n: usize, nb: usize, grid: &Grid, myrow: usize, mycol: usize) -> u64 {
        let mp = numroc(n, nb, myrow, grid.p).max(1) as u64;
        let nq = numroc(n + 1, nb, mycol, grid.q) as u64;
        mp.saturating_mul(nq).saturating_mul(8)
    }

    /// This rank's blocks of HPL's [A | b] for `seed`.
    pub fn generate(n: usize, nb: usize, grid: Grid, rank: usize, seed: u64) -> LocalMatrix {
        let (myrow, mycol) = grid.coords(rank);
        let mp = numroc(n, nb, myrow, grid.p);
        let nq = numroc(n + 1, nb, mycol, grid.q);
        let lda = mp.max(1);
        let mut a = zeroed(lda * nq);
        let rows: Vec<u64> = (0..mp)
            .map(|l| local_to_global(l, nb, myrow, grid.p) as u64)
            .collect();
        for lc in 0..nq {
            let g = local_to_global(lc, nb, mycol, grid.q) as u64;
            generator::column(seed, n as u64, g, &rows, &mut a[lc * lda..lc * lda + mp]);
        }
        LocalMatrix {
            layout: Layout {
                n,
                nb,
                grid,
                myrow,
                mycol,
                mp,
                nq,
                lda,
            },
            a,
        }
    }

    #[inline]
    pub fn at(&self, i: usize, j: usize) -> f64 {
        self.a[j * self.lda + i]
    }

    /// Copies local rows `row` of columns `cols` out (for a swap or a broadcast).
    pub fn row_segment(&self, row: usize, cols: std::ops::Range<usize>) -> Vec<f64> {
        cols.map(|c| self.a[c * self.lda + row]).collect()
    }

    pub fn set_row_segment(&mut self, row: usize, cols: std::ops::Range<usize>, values: &[f64]) {
        let lda = self.lda;
        for (c, v) in cols.zip(values) {
            self.a[c * lda + row] = *v;
        }
    }
}

/// `len` zeros in memory the kernel is asked to back with 2 MiB pages (Linux's transparent
/// huge pages, in their usual "madvise" mode). The row swaps and the panel's pivot search
/// stride a whole column (N·8 bytes) from one element to the next, so with 4 KiB pages
/// nearly every access needs its own TLB entry (huge pages measured several percent faster at
/// N=8000; re-measure: `tbbench hpl --nodes 1 --n 8000` with transparent_hugepage at
/// `madvise` and at `never`, interleaved).
pub(crate) fn zeroed(len: usize) -> Vec<f64> {
    // Large zeroed allocations come straight from mmap, untouched: the advice is in place
    // before the first write faults a page in.
    let mut a = vec![0.0; len];
    if std::env::var_os("TBBENCH_NO_THP").is_none() {
        advise_huge_pages(&mut a);
    }
    a
}

fn advise_huge_pages(a: &mut [f64]) {
    #[cfg(target_os = "linux")]
    {
        let start = a.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(a);
        let page = 4096;
        let s = start.div_ceil(page) * page;
        if end > s {
            // SAFETY: the range lies inside `a`'s allocation; the advice changes no contents.
            unsafe {
                libc::madvise(s as *mut libc::c_void, end - s, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = a;
}

impl Layout {
    /// How many of this rank's rows come before global row `g` (its first local row ≥ g).
    pub fn rows_before(&self, g: usize) -> usize {
        numroc(g.min(self.n), self.nb, self.myrow, self.grid.p)
    }

    /// How many of this rank's columns come before global column `g`.
    pub fn cols_before(&self, g: usize) -> usize {
        numroc(g.min(self.n + 1), self.nb, self.mycol, self.grid.q)
    }

    pub fn global_row(&self, l: usize) -> usize {
        local_to_global(l, self.nb, self.myrow, self.grid.p)
    }

    pub fn global_col(&self, l: usize) -> usize {
        local_to_global(l, self.nb, self.mycol, self.grid.q)
    }
}
