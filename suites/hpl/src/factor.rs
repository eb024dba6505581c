//! The distributed right-looking LU with partial pivoting of [A | b] (b is eliminated with
//! A, as HPL does), then the distributed back substitution. One panel of NB columns at a time:
//!
//! 1. panel: the process column owning it factors it recursively (`panel`: HPL's RFACT
//!    and PFACT, each left-looking, Crout or right-looking: NDIV parts down to NBMIN
//!    columns, each pivot picked with a maxloc over the process column, its row swapped and
//!    broadcast);
//! 2. broadcast: the panel (L21 and the pivots) goes along each process row (with one
//!    process column it is used in place);
//! 3. swaps: every process column applies the pivots to its trailing columns (`swap`:
//!    HPL's SWAP, binary exchange, long or mix);
//! 4. update: the process row owning the panel's rows solves U12 = L11⁻¹·A12 and sends it
//!    down each process column; everyone updates A22 −= L21·U12.
//!
//! With lookahead (HPL's DEPTH 1) the process column owning the next panel applies step 4 to
//! that panel's columns first, factors and broadcasts it, and only then updates the rest of
//! its trailing matrix; the other columns receive the next panel while they update, so no
//! column idles while one factors. DEPTH d keeps d panels factored ahead of the update: the
//! next one's columns are brought up to date with the current panel and the d − 1 factored
//! after it before it is factored in turn.

use crate::grid::{numroc, owner, Grid};
use crate::input::{Algorithm, Broadcast};
use crate::kernels;
use crate::matrix::{self, Layout, LocalMatrix};
use crate::packed_product::{self, PackedL21, Product, Shape};
use crate::panel::{Panel, PanelColumns};
use crate::swap;
use crate::swap_solve::{self, PackedL, Solver};
use anyhow::Result;
use serde::Serialize;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;
use tbbench_runners::comm::{f64_bytes_mut, Comm, Group};
use tbbench_runners::transport::Waiting;

/// Where one rank's time went, in seconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Timings {
    pub panel: f64,
    pub broadcast: f64,
    /// The row swaps (local moves and, with several process rows, messages).
    pub swap: f64,
    /// With one process row and the tile solver: the row swaps and U12's triangular solve,
    /// fused (`swap_solve`), all local; the two cannot be timed apart.
    pub swap_solve: f64,
    /// U12's solve (unless fused with the swaps) and broadcast down the column, and the
    /// trailing matrix's product.
    pub update: f64,
    pub solve: f64,
}

fn column_group(grid: &Grid, col: usize) -> Vec<usize> {
    (0..grid.p).map(|r| grid.rank_at(r, col)).collect()
}

fn row_group(grid: &Grid, row: usize) -> Vec<usize> {
    (0..grid.q).map(|c| grid.rank_at(row, c)).collect()
}

/// One factored panel as a rank of its process row holds it: L (its rows at and below `j0`,
/// column-major with leading dimension `rows`) followed by the pivots, packed for the row
/// broadcast; with one process column nothing is packed and L is read in place.
struct Factored {
    j0: usize,
    jb: usize,
    /// This rank's local column and row where the panel starts.
    c0: usize,
    r0: usize,
    rows: usize,
    packed: Vec<f64>,
    ipiv: Vec<u64>,
}

impl Factored {
    /// The panel at global column `j0`, packed (with more than one process column) into a
    /// buffer `retire` handed back to `spare` when one is there: panels only shrink, so after
    /// the first few no step allocates (and faults in) a fresh one. Its contents are stale
    /// until the panel is factored or received.
    fn new(m: &LocalMatrix, j0: usize, spare: &mut Vec<Vec<f64>>) -> Factored {
        let jb = m.nb.min(m.n - j0);
        let r0 = m.rows_before(j0);
        let rows = m.mp - r0;
        let len = rows * jb + jb;
        let packed = if m.grid.q == 1 {
            Vec::new()
        } else {
            match spare.pop() {
                Some(mut v) if v.len() >= len => {
                    v.truncate(len);
                    v
                }
                _ => matrix::zeroed(len),
            }
        };
        Factored {
            j0,
            jb,
            c0: m.cols_before(j0),
            r0,
            rows,
            packed,
            ipiv: vec![0; jb],
        }
    }

    fn in_place(&self) -> bool {
        self.packed.is_empty()
    }

    /// Done with: its buffer goes back for the next panel.
    fn retire(self, spare: &mut Vec<Vec<f64>>) {
        if !self.in_place() {
            spare.push(self.packed);
        }
    }
}

/// What the factorization did, in order, on this thread: for the tests to pin the lookahead's
/// schedule (a DEPTH run as a shallower one would give the same x).
#[cfg(test)]
pub(crate) mod schedule {
    use std::cell::RefCell;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Event {
        /// The panel starting at this global column was factored here.
        Factor(usize),
        /// The same, on a thread of its own beside the update of the rest (one rank).
        FactorBeside(usize),
        /// The panel starting here updated the trailing columns right of the panels factored
        /// so far.
        Update(usize),
        /// The main update packed the L21 of the panel starting here (`Update`).
        Packed(usize),
    }

    thread_local! {
        static EVENTS: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
    }

    pub fn log(e: Event) {
        EVENTS.with(|v| v.borrow_mut().push(e));
    }

    /// The events since the last call.
    pub fn take() -> Vec<Event> {
        EVENTS.with(|v| std::mem::take(&mut *v.borrow_mut()))
    }
}

#[cfg(test)]
use schedule::{log as log_event, Event};

/// Factors panel `f`, held in `cols` (its own columns of the share), on the process column
/// that owns it.
fn factor_columns(
    lay: &Layout,
    cols: PanelColumns,
    comm: &mut Comm,
    column: &[usize],
    f: &mut Factored,
    algo: &Algorithm,
) -> Result<()> {
    Panel {
        lay,
        cols,
        comm,
        column,
        j0: f.j0,
        jb: f.jb,
        pfact: algo.pfact,
        rfact: algo.rfact,
        nbmin: algo.nbmin,
        ndiv: algo.ndiv,
        ipiv: &mut f.ipiv,
        trace: None,
        next_max: None,
    }
    .factor()
}

/// Factors the panel at `f.j0` on the process column that owns it, and packs it for the row
/// broadcast.
fn factor_panel(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    f: &mut Factored,
    algo: &Algorithm,
) -> Result<()> {
    let lda = m.lda;
    #[cfg(test)]
    log_event(Event::Factor(f.j0));
    let cols = PanelColumns::of(&mut m.a, lda, f.c0, f.jb);
    factor_columns(&m.layout, cols, comm, column, f, algo)?;
    if !f.in_place() {
        let (rows, jb) = (f.rows, f.jb);
        for k in 0..jb {
            let src = (f.c0 + k) * m.lda + f.r0;
            f.packed[k * rows..(k + 1) * rows].copy_from_slice(&m.a[src..src + rows]);
        }
        for (k, p) in f.ipiv.iter().enumerate() {
            f.packed[rows * jb + k] = f64::from_bits(*p);
        }
    }
    Ok(())
}

/// Sends the panel (L and pivots) from `root` along this rank's process row.
fn broadcast_panel(
    comm: &mut Comm,
    row: &[usize],
    root: usize,
    bcast: Broadcast,
    f: &mut Factored,
) -> Result<()> {
    if f.in_place() {
        return Ok(());
    }
    // HPL.dat's six BCAST variants, each as HPL defines its message pattern. A row round a
    // ring, cabled only between neighbours, takes the ring variants (its note says so).
    let (g, buf) = (Group::Members(row), f64_bytes_mut(&mut f.packed));
    let every_pair = || {
        (0..row.len())
            .flat_map(|a| (a + 1..row.len()).map(move |b| [a, b]))
            .collect()
    };
    let bcast = if comm.group_on_cables(g, every_pair) {
        bcast
    } else {
        bcast.round_the_ring()
    };
    match bcast {
        Broadcast::IncreasingRing => comm.bcast_ring_in(g, root, buf)?,
        Broadcast::IncreasingRingModified => {
            comm.bcast_modified_in(g, root, buf, Comm::bcast_ring_in)?
        }
        Broadcast::IncreasingTwoRing => comm.bcast_two_ring_in(g, root, buf)?,
        Broadcast::IncreasingTwoRingModified => {
            comm.bcast_modified_in(g, root, buf, Comm::bcast_two_ring_in)?
        }
        Broadcast::Long => comm.bcast_long_in(g, root, buf)?,
        Broadcast::LongModified => comm.bcast_modified_in(g, root, buf, Comm::bcast_long_in)?,
    }
    let (rows, jb) = (f.rows, f.jb);
    for (k, p) in f.ipiv.iter_mut().enumerate() {
        *p = f.packed[rows * jb + k].to_bits();
    }
    Ok(())
}

/// U12 of one panel for a range of local columns, as the update reads it.
#[derive(Clone, Copy)]
enum U12<'a> {
    /// In the share itself, the panel's rows of those columns (one process row: U12 goes
    /// nowhere, so it is neither copied nor sent).
    InPlace,
    /// Received down the process column: `jb` values per column from local column `first`.
    Held { first: usize, values: &'a [f64] },
}

/// `buf`'s first `len` values, reallocated only when it is too short (a trailing matrix only
/// shrinks, so the first step's allocation serves the rest): no fresh pages to fault in and
/// zero at every step. The contents are stale; callers overwrite all `len`.
fn scratch(buf: &mut Vec<f64>, len: usize) -> &mut [f64] {
    if buf.len() < len {
        *buf = matrix::zeroed(len);
    }
    &mut buf[..len]
}

/// U12 = L11⁻¹·A12 over local columns `cols`, solved on the panel's process row and sent down
/// this process column (every member of the column calls it with the same `cols`), in `buf`.
fn solve_u12<'b>(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    f: &Factored,
    cols: Range<usize>,
    buf: &'b mut Vec<f64>,
) -> Result<U12<'b>> {
    let (jb, r0, width, lda) = (f.jb, f.r0, cols.len(), m.lda);
    let pr = owner(f.j0, m.nb, m.grid.p);
    if width > 0 && m.myrow == pr {
        if swap_solve::solver() == Solver::Tiles {
            let l11 = l11_packed(m, f);
            swap_solve::swap_and_solve(
                &mut m.a,
                lda,
                cols.clone(),
                r0,
                &[],
                &l11,
                kernels::threads(),
            );
        } else {
            let (left, right) = m.a.split_at_mut(cols.start * lda);
            let (l11, ld) = l11_of(left, lda, f);
            kernels::trsm_unit_lower(jb, width, l11, ld, &mut right[r0..], lda);
        }
    }
    if m.grid.p == 1 {
        return Ok(U12::InPlace);
    }
    let u12 = scratch(buf, jb * width);
    if width == 0 {
        return Ok(U12::Held {
            first: cols.start,
            values: u12,
        });
    }
    if m.myrow == pr {
        for c in 0..width {
            let src = (cols.start + c) * lda + r0;
            u12[c * jb..(c + 1) * jb].copy_from_slice(&m.a[src..src + jb]);
        }
    }
    comm.bcast_in(
        Group::Members(column),
        m.grid.rank_at(pr, m.mycol),
        f64_bytes_mut(u12),
    )?;
    Ok(U12::Held {
        first: cols.start,
        values: u12,
    })
}

/// The panel's L11 (its unit lower triangle; U11 above it is not read) and its leading
/// dimension: in place in the share's columns left of the trailing ones (`left`), or in the
/// packed copy.
fn l11_of<'a>(left: &'a [f64], lda: usize, f: &'a Factored) -> (&'a [f64], usize) {
    if f.in_place() {
        (&left[f.c0 * lda + f.r0..], lda)
    } else {
        (&f.packed[..], f.rows)
    }
}

fn l11_packed(m: &LocalMatrix, f: &Factored) -> PackedL {
    let (l11, ld) = l11_of(&m.a, m.lda, f);
    PackedL::new(f.jb, l11, ld)
}

/// Panel `f`'s row swaps and U12 solve over local columns `cols` (collectives over the process
/// column, so every member calls it with the same columns). With one process row and the
/// tile solver the two run fused (`swap_solve`), timed as one; otherwise the swaps (SWAP's
/// algorithm), timed as swaps, then the solve, counted with the update.
#[allow(clippy::too_many_arguments)]
fn swap_and_solve_u12<'b>(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    f: &Factored,
    cols: Range<usize>,
    algo: &Algorithm,
    buf: &'b mut Vec<f64>,
    t: &mut Timings,
    clock: &mut Instant,
) -> Result<U12<'b>> {
    if m.grid.p == 1 && swap_solve::solver() == Solver::Tiles {
        if !cols.is_empty() {
            // One process row: local rows are global rows.
            let piv: Vec<usize> = f.ipiv.iter().map(|&g| g as usize).collect();
            let l11 = l11_packed(m, f);
            let lda = m.lda;
            swap_solve::swap_and_solve(&mut m.a, lda, cols, f.r0, &piv, &l11, kernels::threads());
        }
        t.swap_solve += lap(clock);
        return Ok(U12::InPlace);
    }
    swap::apply_pivots(m, comm, column, f.j0, &f.ipiv, cols.clone(), algo.swap)?;
    t.swap += lap(clock);
    solve_u12(m, comm, column, f, cols, buf)
}

/// The trailing update's product for one factorization: the BLAS's dgemm per call, or
/// `packed_product`'s, with L21 packed on the first update a panel makes and reused by the
/// rest of its columns.
struct Update {
    product: Product,
    threads: usize,
    packed: PackedL21,
    /// The panel (its first column) `packed` holds.
    packed_panel: Option<usize>,
    /// Whether its packings are logged (the main update's, not the catch-ups').
    #[cfg(test)]
    logged: bool,
}

impl Update {
    fn new(product: Product, threads: usize) -> Update {
        Update {
            product,
            threads,
            packed: PackedL21::default(),
            packed_panel: None,
            #[cfg(test)]
            logged: true,
        }
    }

    /// `f`'s L21 as packed by this update, where it has packed it.
    fn packed_for(&self, f: &Factored) -> Option<&PackedL21> {
        (self.packed_panel == Some(f.j0)).then_some(&self.packed)
    }

    /// A22 −= L21·U12 over local columns `cols`.
    fn apply(&mut self, m: &mut LocalMatrix, f: &Factored, cols: Range<usize>, u12: U12) {
        let below = m.rows_before(f.j0 + f.jb);
        let (lda, width, mp) = (m.lda, cols.len(), m.mp);
        let rows = mp.saturating_sub(below);
        if self.product == Product::Blas && (width == 0 || rows == 0) {
            return;
        }
        let (left, right) = m.a.split_at_mut(cols.start * lda);
        let (l21, ldl) = if f.in_place() {
            (left.get(f.c0 * lda + below..).unwrap_or_default(), lda)
        } else {
            (f.packed.get(below - f.r0..).unwrap_or_default(), f.rows)
        };
        let columns = match u12 {
            // One process row: U12's rows sit right above A22's in every column.
            U12::InPlace => {
                debug_assert_eq!(below, f.r0 + f.jb);
                packed_product::Columns::Below {
                    bc: right.get_mut(f.r0..).unwrap_or_default(),
                    ld: lda,
                }
            }
            U12::Held { first, values } => packed_product::Columns::Apart {
                b: &values[(cols.start - first) * f.jb..],
                ldb: f.jb,
                c: right.get_mut(below..).unwrap_or_default(),
                ldc: lda,
            },
        };
        match self.product {
            Product::Blas => match columns {
                packed_product::Columns::Below { bc, ld } => {
                    kernels::gemm_minus_below(rows, width, f.jb, l21, ldl, bc, ld)
                }
                packed_product::Columns::Apart { b, ldb, c, ldc } => {
                    kernels::gemm_minus(rows, width, f.jb, l21, ldl, b, ldb, c, ldc)
                }
            },
            Product::Packed if self.packed_panel == Some(f.j0) => {
                packed_product::gemm_minus(&self.packed, columns, width, self.threads)
            }
            Product::Packed => {
                self.packed_panel = Some(f.j0);
                #[cfg(test)]
                if self.logged {
                    log_event(Event::Packed(f.j0));
                }
                packed_product::pack_and_update(
                    &mut self.packed,
                    rows,
                    f.jb,
                    l21,
                    ldl,
                    columns,
                    width,
                    self.threads,
                )
            }
        }
    }
}

/// Bytes the factorization allocates besides the share, at most, on the rank at (myrow,
/// mycol): the panels held at once (with more than one process column, where they are
/// copies: the current one and the next, or with lookahead `depth` the current one, d − 1
/// ahead and the next; never more than there are panels), U12, the rows a swap moves, and
/// L21 packed for the update.
pub fn workspace_bytes(
    n: usize,
    nb: usize,
    grid: &Grid,
    myrow: usize,
    mycol: usize,
    depth: usize,
) -> u64 {
    let mp = numroc(n, nb, myrow, grid.p) as u64;
    let nq = numroc(n + 1, nb, mycol, grid.q) as u64;
    let nb = nb.clamp(1, n.max(1)) as u64;
    let held = (n as u64)
        .div_ceil(nb)
        .min((depth as u64).saturating_add(1).max(2));
    let panels = if grid.q > 1 {
        held.saturating_mul(mp + 1).saturating_mul(nb)
    } else {
        0
    };
    // L21 packed for `packed_product` (a 24-row multiple, plus a cache line), and at DEPTH
    // 2 and up a second packing for the catch-ups (where there is no BLAS). Counted whatever
    // product runs and whatever this host's CPU: every rank works out every rank's bytes, and
    // they must agree.
    let packings = if depth >= 2 { 2 } else { 1 };
    let packed_l21 = (PackedL21::len_for(mp as usize, nb as usize) as u64 + 8) * packings;
    panels
        .saturating_add(3 * nb * nq)
        .saturating_add(packed_l21)
        .saturating_mul(8)
}

/// Seconds since the last lap, so every stretch of time lands in exactly one bucket.
fn lap(clock: &mut Instant) -> f64 {
    let now = Instant::now();
    let s = (now - *clock).as_secs_f64();
    *clock = now;
    s
}

/// Brings local columns `cols` of this process column up to date with `panels`, in order:
/// each one's pivots, U12 solve and update (collectives over the process column, so every
/// member calls it with the same columns).
#[allow(clippy::too_many_arguments)]
fn catch_up<'f>(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    panels: impl Iterator<Item = &'f Factored>,
    cols: Range<usize>,
    algo: &Algorithm,
    update: &mut Update,
    u12_buf: &mut Vec<f64>,
    t: &mut Timings,
    clock: &mut Instant,
) -> Result<()> {
    for f in panels {
        let u12 = swap_and_solve_u12(m, comm, column, f, cols.clone(), algo, u12_buf, t, clock)?;
        update.apply(m, f, cols.clone(), u12);
        t.update += lap(clock);
    }
    Ok(())
}

/// The threads a step may split over: the rank's kernel threads (a test sets its own).
fn step_threads() -> usize {
    #[cfg(test)]
    if let Some(t) = TEST_THREADS.with(|c| c.get()) {
        return t;
    }
    kernels::threads()
}

#[cfg(test)]
thread_local! {
    /// A test's thread count for the ranks it runs as threads (the process's is shared).
    pub(crate) static TEST_THREADS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Whether a run factors on `factor_one_rank`'s path.
pub fn one_rank_path(grid: &Grid, depth: usize, threads: usize) -> bool {
    depth == 1 && grid.p == 1 && grid.q == 1 && threads > 1
}

/// How such a run calls the trailing update's product: in chunks on `factor_one_rank`'s
/// path, else once per panel over the trailing columns.
pub fn product_shape(grid: &Grid, depth: usize, threads: usize) -> Shape {
    if one_rank_path(grid, depth, threads) {
        Shape::Chunks
    } else {
        Shape::Whole
    }
}

/// DEPTH 1 on a single rank with several threads. A rank alone has no broadcast to hide, but
/// its panels are a serial stretch (tall, narrow, with a pivot search per column) that leaves
/// all but one core idle: 4% of a 1-rank N=10000 NB=128 run on 2 cores, another 6% in the
/// swaps and U12 solve, memory-bound. So each step brings the next panel's columns up to date
/// with every thread, then factors that panel on one thread while the others take the rest of
/// the trailing columns in chunks (swaps, U12 and product per chunk, one BLAS thread each);
/// the panel's thread joins them when it is done. The panels' time is inside `update`.
#[allow(clippy::too_many_arguments)]
fn factor_one_rank(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    algo: &Algorithm,
    mut cur: Factored,
    mut update: Update,
    t: &mut Timings,
    clock: &mut Instant,
    mut on_panel: impl FnMut(usize),
) -> Result<()> {
    // Chosen here: the solver may be a test's choice, local to this thread.
    let solver = swap_solve::solver();
    let threads = update.threads;
    let (mut spare, mut u12_buf) = (Vec::new(), Vec::new());
    loop {
        let end = cur.j0 + cur.jb;
        let (ct, nq) = (m.cols_before(end), m.nq);
        let next_cols = if end < m.n {
            m.cols_before(end + m.nb.min(m.n - end))
        } else {
            nq
        };
        let u12 = swap_and_solve_u12(
            m,
            comm,
            column,
            &cur,
            ct..next_cols,
            algo,
            &mut u12_buf,
            t,
            clock,
        )?;
        // With the packed product, L21 is packed here, for every chunk of the rest to read.
        update.apply(m, &cur, ct..next_cols, u12);
        t.update += lap(clock);
        if end >= m.n {
            #[cfg(test)]
            log_event(Event::Update(cur.j0));
            on_panel(end);
            return Ok(());
        }
        let mut next = Factored::new(m, end, &mut spare);
        #[cfg(test)]
        {
            log_event(Event::FactorBeside(end));
            log_event(Event::Update(cur.j0));
        }
        factor_beside_update(
            m,
            comm,
            column,
            algo,
            &cur,
            &mut next,
            next_cols..nq,
            solver,
            update.packed_for(&cur),
            threads,
        )?;
        t.update += lap(clock);
        on_panel(end);
        cur = next;
    }
}

/// Panel `next` factored on one thread while `threads` − 1 others (and then that one) apply
/// panel `cur` to local columns `cols` (one rank: everything local, `next`'s columns already
/// up to date with `cur`).
#[allow(clippy::too_many_arguments)]
fn factor_beside_update(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    algo: &Algorithm,
    cur: &Factored,
    next: &mut Factored,
    cols: Range<usize>,
    solver: Solver,
    packed_l21: Option<&PackedL21>,
    threads: usize,
) -> Result<()> {
    let (lay, lda) = (m.layout.clone(), m.lda);
    let packed_l11 = (solver == Solver::Tiles).then(|| l11_packed(m, cur));
    let (left, right) = m.a.split_at_mut(cols.start * lda);
    let (left, panel) = left.split_at_mut(next.c0 * lda);
    let update = LocalUpdate {
        l: &left[cur.c0 * lda..],
        lda,
        mp: lay.mp,
        r0: cur.r0,
        jb: cur.jb,
        ipiv: &cur.ipiv,
        pivots: cur.ipiv.iter().map(|&g| g as usize).collect(),
        packed_l11,
        packed_l21,
    };
    let pool = Mutex::new(right);
    // One BLAS thread per caller while the threads share the columns out themselves.
    kernels::set_blas_threads(1);
    let factored = std::thread::scope(|s| {
        let helpers: Vec<_> = (2..threads)
            .map(|_| s.spawn(|| update.take_chunks(&pool, threads)))
            .collect();
        let panel_thread = s.spawn(|| {
            let cols = PanelColumns::of(panel, lda, 0, next.jb);
            let factored = factor_columns(&lay, cols, comm, column, next, algo);
            update.take_chunks(&pool, threads);
            factored
        });
        update.take_chunks(&pool, threads);
        for h in helpers {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
        panel_thread.join()
    });
    kernels::set_blas_threads(kernels::threads());
    match factored {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// One panel's swaps, U12 solve and trailing product over any columns of a single rank's
/// share, as the threads of `factor_beside_update` apply it chunk by chunk.
struct LocalUpdate<'a> {
    /// The share from the panel's first column on (L11 at row `r0`, L21 below it).
    l: &'a [f64],
    lda: usize,
    mp: usize,
    r0: usize,
    jb: usize,
    ipiv: &'a [u64],
    pivots: Vec<usize>,
    /// L11 packed for the tile solver (None: dlaswp and dtrsm).
    packed_l11: Option<PackedL>,
    /// L21 packed for `packed_product` (None: the BLAS's dgemm).
    packed_l21: Option<&'a PackedL21>,
}

impl LocalUpdate<'_> {
    /// Takes chunks of columns off the front of `pool` until none are left. The chunks shrink
    /// as the pool does (a share of what is left per thread, 64 to 512 columns), so the
    /// threads finish within a small chunk of each other and each product stays wide enough
    /// for the BLAS to run at its rate.
    fn take_chunks(&self, pool: &Mutex<&mut [f64]>, threads: usize) {
        loop {
            let chunk = {
                let mut rest = pool.lock().unwrap_or_else(|e| e.into_inner());
                let left = rest.len() / self.lda;
                if left == 0 {
                    return;
                }
                let take = (left / (2 * threads)).clamp(64, 512).min(left);
                let (chunk, tail) = std::mem::take(&mut *rest).split_at_mut(take * self.lda);
                *rest = tail;
                chunk
            };
            self.apply(chunk);
        }
    }

    /// The update of the whole columns in `a`.
    fn apply(&self, a: &mut [f64]) {
        let (lda, r0, jb) = (self.lda, self.r0, self.jb);
        let width = a.len() / lda;
        match &self.packed_l11 {
            Some(l11) => swap_solve::swap_and_solve(a, lda, 0..width, r0, &self.pivots, l11, 1),
            None => {
                swap::local(a, lda, self.mp, width, r0, self.ipiv);
                kernels::trsm_unit_lower(jb, width, &self.l[r0..], lda, &mut a[r0..], lda);
            }
        }
        if let Some(l21) = self.packed_l21 {
            let cols = packed_product::Columns::Below {
                bc: &mut a[r0..],
                ld: lda,
            };
            packed_product::gemm_minus(l21, cols, width, 1);
            return;
        }
        let below = r0 + jb;
        kernels::gemm_minus_below(
            self.mp.saturating_sub(below),
            width,
            jb,
            &self.l[below.min(self.l.len())..],
            lda,
            &mut a[r0..],
            lda,
        );
    }
}

/// Factors [A | b] in place; on return this rank's share holds its part of U and of the
/// transformed b, with `algo`'s variants (any lookahead DEPTH) and the trailing update's
/// `product` (`Product::Packed` only where `packed_product::available()`).
/// `on_panel(columns done)` runs on every rank after each panel.
pub fn factor(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    algo: &Algorithm,
    product: Product,
    t: &mut Timings,
    mut on_panel: impl FnMut(usize),
) -> Result<()> {
    let (bcast, depth) = (algo.bcast, algo.depth);
    let (n, nb, grid) = (m.n, m.nb, m.grid.clone());
    if n == 0 {
        return Ok(());
    }
    let my_column = column_group(&grid, m.mycol);
    let my_row = row_group(&grid, m.myrow);
    let myrow = m.myrow;
    let row_grid = grid.clone();
    let root_in_row = move |j0: usize| row_grid.rank_at(myrow, owner(j0, nb, row_grid.q));
    let mut clock = Instant::now();
    // U12 of the panel updating the trailing matrix, and of the panels a lookahead catches
    // up with meanwhile.
    let (mut u12_buf, mut catch_up_buf) = (Vec::new(), Vec::new());
    // Buffers of panels done with, for the next ones.
    let mut spare: Vec<Vec<f64>> = Vec::new();

    // The first panel has nothing to hide behind.
    let mut cur = Factored::new(m, 0, &mut spare);
    if m.mycol == owner(0, nb, grid.q) {
        factor_panel(m, comm, &my_column, &mut cur, algo)?;
    }
    t.panel += lap(&mut clock);
    broadcast_panel(comm, &my_row, root_in_row(0), bcast, &mut cur)?;
    t.broadcast += lap(&mut clock);

    let threads = step_threads();
    let mut update = Update::new(product, threads);
    if one_rank_path(&grid, depth, threads) {
        return factor_one_rank(
            m, comm, &my_column, algo, cur, update, t, &mut clock, on_panel,
        );
    }
    // The lookahead's catch-ups apply the panels ahead to a panel's width of columns, where
    // the BLAS packs L21 once per call as well; through it (or, without a BLAS, an update of
    // their own), `update` keeps `cur`'s packing.
    let narrow_product = if kernels::blas().is_some() {
        Product::Blas
    } else {
        product
    };
    let mut narrow = Update::new(narrow_product, threads);
    #[cfg(test)]
    {
        narrow.logged = false;
    }
    if depth == 0 {
        loop {
            let next_j0 = cur.j0 + cur.jb;
            let ct = m.cols_before(next_j0);
            let nq = m.nq;
            catch_up(
                m,
                comm,
                &my_column,
                [&cur].into_iter(),
                ct..nq,
                algo,
                &mut update,
                &mut u12_buf,
                t,
                &mut clock,
            )?;
            #[cfg(test)]
            log_event(Event::Update(cur.j0));
            if next_j0 >= n {
                on_panel(n);
                return Ok(());
            }
            let mut next = Factored::new(m, next_j0, &mut spare);
            if m.mycol == owner(next_j0, nb, grid.q) {
                factor_panel(m, comm, &my_column, &mut next, algo)?;
            }
            t.panel += lap(&mut clock);
            broadcast_panel(comm, &my_row, root_in_row(next_j0), bcast, &mut next)?;
            t.broadcast += lap(&mut clock);
            on_panel(next_j0);
            std::mem::replace(&mut cur, next).retire(&mut spare);
        }
    }

    // Lookahead DEPTH d: panels j+1 .. j+d−1 are factored (and sent) before panel j's update
    // of the rest, and during it panel j+d is. `ahead` holds those factored after `cur`; the
    // columns right of the last of them are up to date with every panel before `cur`.
    // Start-up (DEPTH ≥ 2): panels 1 .. d−1 in turn, each brought up to date with those before
    // it, factored and sent, with nothing to hide them behind.
    let mut ahead: VecDeque<Factored> = VecDeque::new();
    let mut end = cur.j0 + cur.jb;
    while ahead.len() + 1 < depth && end < n {
        let mut f = Factored::new(m, end, &mut spare);
        if m.mycol == owner(end, nb, grid.q) {
            let cols = f.c0..f.c0 + f.jb;
            let before = std::iter::once(&cur).chain(ahead.iter());
            catch_up(
                m,
                comm,
                &my_column,
                before,
                cols,
                algo,
                &mut narrow,
                &mut u12_buf,
                t,
                &mut clock,
            )?;
            factor_panel(m, comm, &my_column, &mut f, algo)?;
            t.panel += lap(&mut clock);
        }
        broadcast_panel(comm, &my_row, root_in_row(end), bcast, &mut f)?;
        t.broadcast += lap(&mut clock);
        end += f.jb;
        ahead.push_back(f);
    }
    loop {
        // Panel `cur` over every column right of the panels factored so far.
        let end = ahead.back().map_or(cur.j0 + cur.jb, |f| f.j0 + f.jb);
        let ct = m.cols_before(end);
        let nq = m.nq;
        let u12 = swap_and_solve_u12(
            m,
            comm,
            &my_column,
            &cur,
            ct..nq,
            algo,
            &mut u12_buf,
            t,
            &mut clock,
        )?;
        if end >= n {
            // Nothing left to factor: the panels in flight only update.
            update.apply(m, &cur, ct..nq, u12);
            #[cfg(test)]
            log_event(Event::Update(cur.j0));
            t.update += lap(&mut clock);
            on_panel(cur.j0 + cur.jb);
            match ahead.pop_front() {
                Some(f) => std::mem::replace(&mut cur, f).retire(&mut spare),
                None => return Ok(()),
            }
            continue;
        }
        // The process column owning the next panel brings only that panel's columns up to
        // date (with `cur`, then the panels ahead), factors it, and then updates the rest of
        // its trailing matrix; the other columns update all of theirs. The transports' sends
        // and receives block until both ends meet, so the panel travels on a second thread
        // meanwhile, alongside the update's matrix product (the one step that needs no
        // messages): its owner sends as soon as it is factored, the others receive it while
        // they update, and nobody waits for another's whole update.
        let mut next = Factored::new(m, end, &mut spare);
        let mut rest = ct;
        if m.mycol == owner(end, nb, grid.q) {
            rest = m.cols_before(end + next.jb);
            update.apply(m, &cur, ct..rest, u12);
            t.update += lap(&mut clock);
            catch_up(
                m,
                comm,
                &my_column,
                ahead.iter(),
                ct..rest,
                algo,
                &mut narrow,
                &mut catch_up_buf,
                t,
                &mut clock,
            )?;
            factor_panel(m, comm, &my_column, &mut next, algo)?;
            t.panel += lap(&mut clock);
        }
        #[cfg(test)]
        log_event(Event::Update(cur.j0));
        if next.in_place() {
            update.apply(m, &cur, rest..nq, u12);
            t.update += lap(&mut clock);
        } else {
            let root = root_in_row(end);
            // The update runs on every core this rank was given: the helper's waits sleep
            // rather than spin, or they take those cores from it (2 ranks on 2 cores, N=1000:
            // 59 Gflops asleep against 29 spinning, medians of 5).
            comm.set_waiting(Waiting::Beside);
            let moved = std::thread::scope(|s| {
                let helper = s.spawn(|| broadcast_panel(comm, &my_row, root, bcast, &mut next));
                update.apply(m, &cur, rest..nq, u12);
                t.update += lap(&mut clock);
                helper.join()
            });
            comm.set_waiting(Waiting::Spin);
            match moved {
                Ok(r) => r?,
                Err(panic) => std::panic::resume_unwind(panic),
            }
            t.broadcast += lap(&mut clock);
        }
        on_panel(cur.j0 + cur.jb);
        ahead.push_back(next);
        let following = ahead.pop_front().expect("the panel just pushed");
        std::mem::replace(&mut cur, following).retire(&mut spare);
    }
}

/// Back substitution Ux = y over the distributed U, y being the transformed b (global
/// column n). Every rank ends with all of x.
pub fn solve(m: &LocalMatrix, comm: &mut Comm, t: &mut Timings) -> Result<Vec<f64>> {
    let clock = Instant::now();
    let (n, nb, grid) = (m.n, m.nb, m.grid.clone());
    let row = row_group(&grid, m.myrow);
    let pc_b = owner(n, nb, grid.q);
    let lc_b = m.cols_before(n);
    // This rank's piece of y (only the process column holding b has one).
    let mut y: Vec<f64> = if m.mycol == pc_b {
        (0..m.mp).map(|i| m.at(i, lc_b)).collect()
    } else {
        Vec::new()
    };
    let mut x = vec![0.0; n];
    let blocks = n.div_ceil(nb);
    for k in (0..blocks).rev() {
        let kb = k * nb;
        let kw = nb.min(n - kb);
        let (prk, pck) = (owner(kb, nb, grid.p), owner(kb, nb, grid.q));
        let diag = grid.rank_at(prk, pck);
        let lr = m.rows_before(kb);
        let mut xk = vec![0.0; kw];
        if m.myrow == prk {
            // y_k travels from the b column to the diagonal block's owner (relayed along the
            // row where the two have no cable: a row round a ring).
            let holder = grid.rank_at(prk, pc_b);
            if comm.rank() == holder {
                xk.copy_from_slice(&y[lr..lr + kw]);
            }
            comm.relay_in(Group::Members(&row), holder, diag, f64_bytes_mut(&mut xk))?;
            if comm.rank() == diag {
                let lc = m.cols_before(kb);
                kernels::trsv_upper(kw, &m.a[lc * m.lda + lr..], m.lda, &mut xk);
            }
        }
        comm.bcast(diag, f64_bytes_mut(&mut xk))?;
        x[kb..kb + kw].copy_from_slice(&xk);
        // y_above −= U(above, block k) · x_k: computed where U's block column lives, applied
        // where y lives.
        if lr == 0 {
            continue;
        }
        let mut part = vec![0.0; lr];
        if m.mycol == pck {
            let lc = m.cols_before(kb);
            for (c, xv) in xk.iter().enumerate() {
                let col = &m.a[(lc + c) * m.lda..(lc + c) * m.lda + lr];
                for (p, u) in part.iter_mut().zip(col) {
                    *p += u * xv;
                }
            }
        }
        let (from, to) = (grid.rank_at(m.myrow, pck), grid.rank_at(m.myrow, pc_b));
        comm.relay_in(Group::Members(&row), from, to, f64_bytes_mut(&mut part))?;
        if m.mycol == pc_b {
            for (yi, p) in y.iter_mut().zip(&part) {
                *yi -= p;
            }
        }
    }
    t.solve += clock.elapsed().as_secs_f64();
    Ok(x)
}
