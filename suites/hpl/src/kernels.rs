//! The local dense kernels the factorization calls: a BLAS when one is installed (OpenBLAS
//! or the system's libblas on Linux, Accelerate on macOS), loaded at run time, else the pure
//! Rust loops below. Loading at run time keeps one binary that runs with or without a BLAS and
//! lets the result record which library and kernel actually ran.
//! Column-major throughout; the Rust loops run down columns so they vectorize.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

type Dgemm = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const c_int,
    *const c_int,
    *const c_int,
    *const f64,
    *const f64,
    *const c_int,
    *const f64,
    *const c_int,
    *const f64,
    *mut f64,
    *const c_int,
);
type Dlaswp = unsafe extern "C" fn(
    *const c_int,
    *mut f64,
    *const c_int,
    *const c_int,
    *const c_int,
    *const c_int,
    *const c_int,
);
type Dtrsm = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const c_char,
    *const c_char,
    *const c_int,
    *const c_int,
    *const f64,
    *const f64,
    *const c_int,
    *mut f64,
    *const c_int,
);

type Sgemm = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const c_int,
    *const c_int,
    *const c_int,
    *const f32,
    *const f32,
    *const c_int,
    *const f32,
    *const c_int,
    *const f32,
    *mut f32,
    *const c_int,
);
type Strsm = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const c_char,
    *const c_char,
    *const c_int,
    *const c_int,
    *const f32,
    *const f32,
    *const c_int,
    *mut f32,
    *const c_int,
);

/// xGEMV: y ← α·A·x + β·y.
pub(crate) type Gemv<T> = unsafe extern "C" fn(
    *const c_char,
    *const c_int,
    *const c_int,
    *const T,
    *const T,
    *const c_int,
    *const T,
    *const c_int,
    *const T,
    *mut T,
    *const c_int,
);

/// A BLAS found on this host.
pub struct Blas {
    /// "openblas", "accelerate", or the library's file name.
    pub name: String,
    /// openblas_get_corename() and openblas_get_config() where OpenBLAS says; else the path.
    pub kernel: String,
    dgemm: Dgemm,
    dtrsm: Dtrsm,
    /// LAPACK's row interchanges, where the library carries LAPACK (OpenBLAS does).
    dlaswp: Option<Dlaswp>,
    /// Single precision, for HPL-MxP's factorization (every BLAS has them; optional all the
    /// same, so a library without them still serves hpl).
    pub(crate) sgemm: Option<Sgemm>,
    pub(crate) strsm: Option<Strsm>,
    /// Matrix-vector products, for HPL-MxP's refinement.
    pub(crate) dgemv: Option<Gemv<f64>>,
    pub(crate) sgemv: Option<Gemv<f32>>,
    set_threads: Option<unsafe extern "C" fn(c_int)>,
}

static BLAS: OnceLock<Option<Blas>> = OnceLock::new();

/// The BLAS in use, if any (`TBBENCH_BLAS=rust` forces the Rust loops).
pub fn blas() -> Option<&'static Blas> {
    BLAS.get_or_init(load).as_ref()
}

/// How long OpenBLAS's idle workers spin before they sleep, as a power of two of CPU cycles,
/// unless the user set OPENBLAS_THREAD_TIMEOUT: 2^18, about 0.1 ms (OpenBLAS's default is
/// 2^28, about 0.1 s). After each threaded call a worker spins on its core (sched_yield in a
/// loop) for that long; an HPL step is shorter, so with the default the workers never sleep,
/// and the row swaps and U12 solve on tbbench's own threads (`swap_solve`) share a core with
/// a spinner: with 2^18 the fused swaps and solve took about half as long, the panels a
/// little longer (their small calls wake a sleeping worker now and then), the whole run
/// faster. Re-measure: `tbbench hpl --nodes 1 --n 10000` with OPENBLAS_THREAD_TIMEOUT set to
/// 18 and to 28, interleaved; the result's per-phase seconds show where the time went.
pub const OPENBLAS_THREAD_TIMEOUT: &str = "18";

/// Set by tbbench on the process it starts again after OpenBLAS chose a kernel older than the
/// CPU: the kernel OpenBLAS chose itself. Its presence says OPENBLAS_CORETYPE is tbbench's
/// doing (the result records both), and that the check is not to be made again.
pub const ENV_DETECTED: &str = "TBBENCH_OPENBLAS_DETECTED";

/// For the tests only: the kernel OpenBLAS is made to choose for itself (it loads with
/// OPENBLAS_CORETYPE set to this), standing in for a host whose OpenBLAS does not know its
/// CPU (Debian 12's 0.3.21 picks Prescott on Emerald Rapids). Everything after the load runs
/// as on such a host.
pub const ENV_TEST_DETECTS: &str = "TBBENCH_TEST_OPENBLAS_DETECTS";

/// Sets what the BLAS reads from the environment when it loads (OPENBLAS_THREAD_TIMEOUT,
/// above), where the user has not, and tells OpenBLAS the kernel this CPU runs where its own
/// detection fell back to an older one ([`tell_openblas_the_cpu`]), where the command
/// `uses_blas` (every suite records its host's BLAS; report, compare and predict read files
/// only). Called first thing in
/// `main`, while the process has one thread: changing the environment while another thread
/// reads it is undefined in C.
pub fn before_threads(uses_blas: bool) {
    if std::env::var_os("OPENBLAS_THREAD_TIMEOUT").is_none() {
        std::env::set_var("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT);
    }
    // Only a command that loads the BLAS pays for loading it here (and for its threads).
    if uses_blas {
        tell_openblas_the_cpu();
    }
}

/// Where OpenBLAS, left to itself, runs a kernel older than this CPU's vector units (a
/// DYNAMIC_ARCH build that does not know the CPU), starts this program again with
/// OPENBLAS_CORETYPE naming the newest kernel the CPU's features allow ([`kernel_for_cpu`]).
/// OpenBLAS reads the variable once, when it loads, and only loading it tells what it chose,
/// so the process loads it, and where the choice is behind, replaces itself (exec: same pid,
/// arguments and descriptors) with the variable set. Ranks started from here inherit both
/// variables; remote ranks make the check on their own host. Nothing happens where the user
/// set OPENBLAS_CORETYPE (theirs is kept: some old builds need it), with TBBENCH_BLAS=rust,
/// off x86, or where the exec fails (hpl's own packed product then stands in, timed against
/// the BLAS at every NB: `packed_product::finding`).
fn tell_openblas_the_cpu() {
    let set = |v: &str| std::env::var_os(v).is_some();
    if !cfg!(all(target_os = "linux", target_arch = "x86_64"))
        || set("OPENBLAS_CORETYPE")
        || set(ENV_DETECTED)
        || std::env::var("TBBENCH_BLAS").as_deref() == Ok("rust")
    {
        return;
    }
    let test_detects = std::env::var(ENV_TEST_DETECTS).ok();
    if let Some(k) = &test_detects {
        std::env::set_var("OPENBLAS_CORETYPE", k);
    }
    let Some(core) = blas()
        .filter(|b| b.name == "openblas")
        .and_then(|b| b.kernel.split_whitespace().next())
    else {
        return;
    };
    let Some(wanted) = kernel_for_cpu(core, cpu_vectors()) else {
        return;
    };
    let (Ok(exe), Some(arg0)) = (std::env::current_exe(), std::env::args_os().next()) else {
        return;
    };
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(exe)
        .arg0(arg0)
        .args(std::env::args_os().skip(1))
        .env("OPENBLAS_CORETYPE", wanted)
        .env(ENV_DETECTED, core)
        .env_remove(ENV_TEST_DETECTS)
        .exec();
    // Only reached when the exec failed: run on with the kernel OpenBLAS chose.
    eprintln!("tbbench: note: could not start again with OPENBLAS_CORETYPE={wanted} ({e}); OpenBLAS runs its {core} kernel");
}

static THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// The threads this rank's kernels use (set_threads'; 1 until it is called).
pub fn threads() -> usize {
    THREADS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Threads the BLAS may use for each call from now on, leaving `threads()` as it is: for a
/// stretch where the rank's threads each call the BLAS themselves.
pub fn set_blas_threads(n: usize) {
    if let Some(f) = blas().and_then(|b| b.set_threads) {
        // SAFETY: openblas_set_num_threads takes a plain int.
        unsafe { f(n.max(1) as c_int) };
    }
}

/// Threads the BLAS, and tbbench's own threaded kernels, may use in this rank (OpenBLAS would
/// otherwise take every core, and ranks sharing a host would fight over them).
pub fn set_threads(n: usize) {
    THREADS.store(n.max(1), std::sync::atomic::Ordering::Relaxed);
    set_blas_threads(n);
}

fn load() -> Option<Blas> {
    if std::env::var("TBBENCH_BLAS").as_deref() == Ok("rust") {
        return None;
    }
    let candidates: &[&str] = if cfg!(target_os = "macos") {
        &["/System/Library/Frameworks/Accelerate.framework/Accelerate"]
    } else {
        &["libopenblas.so.0", "libopenblas.so", "libblas.so.3"]
    };
    candidates.iter().find_map(|lib| open(lib))
}

fn open(lib: &str) -> Option<Blas> {
    let path = std::ffi::CString::new(lib).ok()?;
    // SAFETY: dlopen/dlsym with NUL-terminated names; the handle is never closed, so the
    // function pointers stay valid for the process's life.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            return None;
        }
        let sym = |name: &CStr| -> *mut c_void { libc::dlsym(h, name.as_ptr()) };
        let (gemm, trsm) = (sym(c"dgemm_"), sym(c"dtrsm_"));
        if gemm.is_null() || trsm.is_null() {
            return None;
        }
        let text = |name: &CStr| -> Option<String> {
            let f = sym(name);
            (!f.is_null()).then(|| {
                let f: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(f);
                CStr::from_ptr(f()).to_string_lossy().trim().to_string()
            })
        };
        let (name, kernel) = match (text(c"openblas_get_corename"), text(c"openblas_get_config")) {
            (Some(core), Some(config)) => ("openblas".to_string(), format!("{core} ({config})")),
            (Some(core), None) => ("openblas".to_string(), core),
            _ if lib.contains("Accelerate") => {
                ("accelerate".to_string(), "Accelerate BLAS".to_string())
            }
            _ => (lib.to_string(), lib.to_string()),
        };
        let set_threads = {
            let f = sym(c"openblas_set_num_threads");
            (!f.is_null())
                .then(|| std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(f))
        };
        let dlaswp = {
            let f = sym(c"dlaswp_");
            (!f.is_null()).then(|| std::mem::transmute::<*mut c_void, Dlaswp>(f))
        };
        let (sgemm, strsm) = (sym(c"sgemm_"), sym(c"strsm_"));
        let (dgemv, sgemv) = (sym(c"dgemv_"), sym(c"sgemv_"));
        Some(Blas {
            name,
            kernel,
            dgemm: std::mem::transmute::<*mut c_void, Dgemm>(gemm),
            dtrsm: std::mem::transmute::<*mut c_void, Dtrsm>(trsm),
            dlaswp,
            sgemm: (!sgemm.is_null()).then(|| std::mem::transmute::<*mut c_void, Sgemm>(sgemm)),
            strsm: (!strsm.is_null()).then(|| std::mem::transmute::<*mut c_void, Strsm>(strsm)),
            dgemv: (!dgemv.is_null()).then(|| std::mem::transmute::<*mut c_void, Gemv<f64>>(dgemv)),
            sgemv: (!sgemv.is_null()).then(|| std::mem::transmute::<*mut c_void, Gemv<f32>>(sgemv)),
            set_threads,
        })
    }
}

/// Applies a panel's pivots to `ncols` columns of `a`: row `first + k` is swapped with row
/// `ipiv[k]` (0-based, ≥ first), k in order. Uses LAPACK's dlaswp when the library has it and
/// returns false when it does not (the caller swaps itself).
pub fn laswp(ncols: usize, a: &mut [f64], lda: usize, first: usize, ipiv: &[u64]) -> bool {
    let Some(f) = blas().and_then(|b| b.dlaswp) else {
        return false;
    };
    // dlaswp counts rows from 1, relative to the pointer handed in (here: row `first`).
    let piv: Vec<c_int> = ipiv
        .iter()
        .map(|&g| (g as usize - first + 1) as c_int)
        .collect();
    let (n, ld, k1, k2, inc) = (
        ncols as c_int,
        lda as c_int,
        1 as c_int,
        piv.len() as c_int,
        1 as c_int,
    );
    // SAFETY: the pivots stay within the column (rows first..mp), ncols columns of lda each.
    unsafe {
        f(
            &n,
            a[first..].as_mut_ptr(),
            &ld,
            &k1,
            &k2,
            piv.as_ptr(),
            &inc,
        )
    };
    true
}

/// Below this many multiply-adds a BLAS call costs more than it saves.
const BLAS_MIN_WORK: usize = 32 * 32 * 32;

/// C[m×n] −= A[m×k] · B[k×n].
#[allow(clippy::too_many_arguments)]
pub fn gemm_minus(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    lda: usize,
    b: &[f64],
    ldb: usize,
    c: &mut [f64],
    ldc: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    if let Some(lib) = blas().filter(|_| m * n * k >= BLAS_MIN_WORK) {
        // SAFETY: `b` and `c` are distinct slices of the sizes the callers guarantee.
        unsafe { blas_gemm_minus(lib, m, n, k, a, lda, b.as_ptr(), ldb, c.as_mut_ptr(), ldc) };
        return;
    }
    for j in 0..n {
        column_minus(
            &mut c[j * ldc..j * ldc + m],
            a,
            lda,
            &b[j * ldb..j * ldb + k],
        );
    }
}

/// C[m×n] −= A[m×k] · B[k×n] where B is the k×n block at the top of `bc` and C the m×n block
/// right below it, both in one column-major array of leading dimension `ld` (U12 and A22 of
/// a share with one process row, used where they lie).
pub fn gemm_minus_below(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    lda: usize,
    bc: &mut [f64],
    ld: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(ld >= k + m && bc.len() >= (n - 1) * ld + k + m);
    if let Some(lib) = blas().filter(|_| m * n * k >= BLAS_MIN_WORK) {
        let p = bc.as_mut_ptr();
        // SAFETY: B (rows 0..k) and C (rows k..k+m) of each column never overlap, and both
        // lie inside `bc` (asserted above).
        unsafe { blas_gemm_minus(lib, m, n, k, a, lda, p, ld, p.add(k), ld) };
        return;
    }
    for j in 0..n {
        let (b, c) = bc[j * ld..j * ld + k + m].split_at_mut(k);
        column_minus(c, a, lda, b);
    }
}

/// c −= A·b for one column (the Rust loops: down A's columns, so they vectorize).
fn column_minus(c: &mut [f64], a: &[f64], lda: usize, b: &[f64]) {
    let m = c.len();
    for (p, &bp) in b.iter().enumerate() {
        if bp != 0.0 {
            for (ci, ai) in c.iter_mut().zip(&a[p * lda..p * lda + m]) {
                *ci -= ai * bp;
            }
        }
    }
}

/// Fortran dgemm computing C −= A·B.
///
/// # Safety
/// `b` (k×n, leading dimension `ldb`) and `c` (m×n, `ldc`) must be valid for those shapes and
/// not overlap; `a` must hold m×k with leading dimension `lda`.
#[allow(clippy::too_many_arguments)]
unsafe fn blas_gemm_minus(
    lib: &Blas,
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    lda: usize,
    b: *const f64,
    ldb: usize,
    c: *mut f64,
    ldc: usize,
) {
    let (mi, ni, ki) = (m as c_int, n as c_int, k as c_int);
    let (ldai, ldbi, ldci) = (lda as c_int, ldb as c_int, ldc as c_int);
    (lib.dgemm)(
        c"N".as_ptr(),
        c"N".as_ptr(),
        &mi,
        &ni,
        &ki,
        &-1.0,
        a.as_ptr(),
        &ldai,
        b,
        &ldbi,
        &1.0,
        c,
        &ldci,
    )
}

/// y += A[m×n]·x (the BLAS's dgemv where it has one).
pub fn gemv_add(m: usize, n: usize, a: &[f64], lda: usize, x: &[f64], y: &mut [f64]) {
    gemv_with(blas().and_then(|b| b.dgemv), 1.0, m, n, a, lda, x, y)
}

/// y += A[m×n]·x with the BLAS's xGEMV `f` where there is one, else the loops (down A's
/// columns, so they vectorize); `one` is the type's 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_with<T>(
    f: Option<Gemv<T>>,
    one: T,
    m: usize,
    n: usize,
    a: &[T],
    lda: usize,
    x: &[T],
    y: &mut [T],
) where
    T: Copy + std::ops::Mul<Output = T> + std::ops::AddAssign,
{
    if m == 0 || n == 0 {
        return;
    }
    assert!(lda >= m && a.len() >= (n - 1) * lda + m && x.len() >= n && y.len() >= m);
    if let Some(f) = f {
        let (mi, ni, ld, inc) = (m as c_int, n as c_int, lda as c_int, 1 as c_int);
        // SAFETY: shapes asserted above.
        unsafe {
            f(
                c"N".as_ptr(),
                &mi,
                &ni,
                &one,
                a.as_ptr(),
                &ld,
                x.as_ptr(),
                &inc,
                &one,
                y.as_mut_ptr(),
                &inc,
            )
        };
        return;
    }
    for (j, &xj) in x[..n].iter().enumerate() {
        for (yi, &ai) in y[..m].iter_mut().zip(&a[j * lda..j * lda + m]) {
            *yi += ai * xj;
        }
    }
}

/// B[k×n] ← L⁻¹·B with L the unit lower triangle of a[k×k] (forward substitution).
pub fn trsm_unit_lower(k: usize, n: usize, a: &[f64], lda: usize, b: &mut [f64], ldb: usize) {
    if k == 0 || n == 0 {
        return;
    }
    if let Some(lib) = blas().filter(|_| k * k * n >= BLAS_MIN_WORK) {
        let (ki, ni, ldai, ldbi) = (k as c_int, n as c_int, lda as c_int, ldb as c_int);
        // SAFETY: Fortran dtrsm (left, lower, no transpose, unit diagonal) on slices the
        // callers size.
        unsafe {
            (lib.dtrsm)(
                c"L".as_ptr(),
                c"L".as_ptr(),
                c"N".as_ptr(),
                c"U".as_ptr(),
                &ki,
                &ni,
                &1.0,
                a.as_ptr(),
                &ldai,
                b.as_mut_ptr(),
                &ldbi,
            )
        };
        return;
    }
    for j in 0..n {
        let bj = &mut b[j * ldb..j * ldb + k];
        for p in 0..k {
            let v = bj[p];
            if v != 0.0 {
                for i in p + 1..k {
                    bj[i] -= a[p * lda + i] * v;
                }
            }
        }
    }
}

/// x ← U⁻¹·x with U the upper triangle (diagonal included) of a[k×k].
pub fn trsv_upper(k: usize, a: &[f64], lda: usize, x: &mut [f64]) {
    for p in (0..k).rev() {
        x[p] /= a[p * lda + p];
        let v = x[p];
        for i in 0..p {
            x[i] -= a[p * lda + i] * v;
        }
    }
}

/// What a result file (and `tbbench env`) records about this host's BLAS: the library, its
/// kernel, and the variables that change the kernel choice or its threads, as set.
/// The widest vector unit this CPU has that a DGEMM kernel would use: "avx512", "avx2" or
/// None (older x86, or not x86: NEON kernels are not judged).
pub fn cpu_vectors() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return Some("avx512");
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Some("avx2");
        }
    }
    None
}

/// The OpenBLAS kernel to ask for (OPENBLAS_CORETYPE) where `core`, the one it runs, is of an
/// older x86 generation than `cpu` ([`cpu_vectors`]): SkylakeX on AVX-512 (its DGEMM is also
/// Cooperlake's and Sapphire Rapids'), Haswell on AVX2 with FMA. None where `core` fits.
pub fn kernel_for_cpu(core: &str, cpu: Option<&str>) -> Option<&'static str> {
    kernel_below_cpu(core, cpu)?;
    Some(match cpu {
        Some("avx512") => "SkylakeX",
        _ => "Haswell",
    })
}

/// What the result and `tbbench env` say of this host's OpenBLAS kernel where it is not the
/// one OpenBLAS would pick on a CPU it knows, and what tbbench did about it: None where there
/// is nothing to say. `detected` is [`ENV_DETECTED`] (tbbench set OPENBLAS_CORETYPE); `below`
/// is [`kernel_below_cpu`]'s line for the kernel that runs now; `packed` whether hpl's own
/// product can stand in for the BLAS's DGEMM on this CPU.
pub fn kernel_note(
    kernel: &str,
    detected: Option<&str>,
    below: Option<&str>,
    packed: bool,
) -> Option<String> {
    let core = kernel.split_whitespace().next().unwrap_or(kernel);
    match (detected, below) {
        (Some(d), None) => Some(format!(
            "OpenBLAS chose its {d} kernel, older than this CPU; tbbench set OPENBLAS_CORETYPE={core} for its own processes"
        )),
        (_, Some(line)) if packed => Some(format!(
            "{line}; hpl times tbbench's own packed product against it at every NB and runs the faster"
        )),
        (_, Some(line)) => Some(line.to_string()),
        (None, None) => None,
    }
}

/// One line when OpenBLAS runs a kernel of an older x86 generation than the CPU (its
/// DYNAMIC_ARCH build did not recognise the CPU, common in VMs that hide the model, or
/// OPENBLAS_CORETYPE forced it): DGEMM then runs at a fraction of what the CPU does. Seen on
/// a 16-core Sapphire Rapids VM: OpenBLAS 0.3.21 chose Prescott (SSE3); `hpl --n 12000` on 1
/// rank ran at 112.7 Gflops with it and 447.1 with OPENBLAS_CORETYPE=SkylakeX. `kernel` is the library's core name (openblas_get_corename), `cpu` is
/// [`cpu_vectors`]. Kernels of AVX2's generation on an AVX-512 CPU are OpenBLAS's own choice
/// for some (Zen 4 runs "Zen") and are not flagged.
pub fn kernel_below_cpu(kernel: &str, cpu: Option<&str>) -> Option<String> {
    // OpenBLAS's x86 core names from before AVX (SSE2/SSE3/SSSE3/SSE4 kernels).
    const PRE_AVX: [&str; 12] = [
        "katmai",
        "coppermine",
        "northwood",
        "prescott",
        "banias",
        "core2",
        "penryn",
        "dunnington",
        "nehalem",
        "atom",
        "opteron",
        "barcelona",
    ];
    let core = kernel.split_whitespace().next()?.to_lowercase();
    let cpu = cpu?;
    if !PRE_AVX.contains(&core.as_str()) && core != "sandybridge" {
        return None;
    }
    // Sandybridge (AVX without FMA) is old only beside AVX2's FMA.
    let wanted = match cpu {
        "avx512" => "SkylakeX",
        _ => "Haswell",
    };
    Some(format!(
        "OpenBLAS runs its {} kernel on a CPU with {}: DGEMM and hpl reach a fraction of the CPU's rate (OPENBLAS_CORETYPE={wanted} for the run, or a newer OpenBLAS that knows the CPU)",
        kernel.split_whitespace().next().unwrap_or(kernel),
        if cpu == "avx512" { "AVX-512" } else { "AVX2 and FMA" }
    ))
}

pub fn record() -> tbbench_schema::Blas {
    let env: Vec<String> = [
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        "OPENBLAS_NUM_THREADS",
        "OPENBLAS_THREAD_TIMEOUT",
        // Accelerate's cap on its own threads (it has no call to set a count).
        "VECLIB_MAXIMUM_THREADS",
    ]
    .iter()
    .filter_map(|v| std::env::var(v).ok().map(|x| format!("{v}={x}")))
    .collect();
    match blas() {
        Some(b) => tbbench_schema::Blas {
            name: b.name.clone(),
            kernel: b.kernel.clone(),
            env,
            note: (b.name == "openblas")
                .then(|| {
                    let below = kernel_below_cpu(&b.kernel, cpu_vectors());
                    let detected = std::env::var(ENV_DETECTED).ok();
                    kernel_note(
                        &b.kernel,
                        detected.as_deref(),
                        below.as_deref(),
                        packed_stands_in(),
                    )
                })
                .flatten(),
        },
        None => tbbench_schema::Blas {
            name: "rust-fallback".into(),
            kernel: "tbbench kernels (pure Rust, one thread): no BLAS found".into(),
            env,
            note: None,
        },
    }
}

/// Whether hpl's own packed product may replace the BLAS's DGEMM here: the CPU runs one of its
/// kernels and TBBENCH_HPL_PRODUCT does not hold hpl to the BLAS.
fn packed_stands_in() -> bool {
    crate::packed_product::available()
        && crate::packed_product::forced() != Ok(Some(crate::packed_product::Product::Blas))
}

/// The line `tbbench env` and doctor count as a problem of this host's BLAS: a kernel older
/// than the CPU that tbbench can neither correct (the user set OPENBLAS_CORETYPE, or the
/// build has one kernel) nor stand in for (`packed_stands_in`). None where hpl runs at the
/// CPU's rate either way; the record's `note` still names the gap.
pub fn kernel_problem(blas: &tbbench_schema::Blas) -> Option<String> {
    if blas.name != "openblas" || packed_stands_in() {
        return None;
    }
    kernel_below_cpu(&blas.kernel, cpu_vectors())
}

#[cfg(test)]
mod kernel_tests {
    use super::kernel_below_cpu;

    #[test]
    fn an_older_kernel_than_the_cpu_is_named() {
        let p = kernel_below_cpu("Prescott (OpenBLAS 0.3.21 DYNAMIC_ARCH)", Some("avx512"));
        assert!(
            p.as_deref()
                .is_some_and(|l| l.contains("Prescott") && l.contains("SkylakeX")),
            "{p:?}"
        );
        assert!(kernel_below_cpu("Sandybridge", Some("avx2")).is_some());
        assert!(kernel_below_cpu("Nehalem", Some("avx2")).is_some());
        // The kernels OpenBLAS picks for these CPUs itself.
        for (k, cpu) in [
            ("SkylakeX", "avx512"),
            ("Cooperlake", "avx512"),
            ("Zen", "avx512"),
            ("Haswell", "avx2"),
        ] {
            assert_eq!(kernel_below_cpu(k, Some(cpu)), None, "{k} on {cpu}");
        }
        // No x86 vector unit known (Arm, old x86): nothing judged.
        assert_eq!(kernel_below_cpu("Prescott", None), None);
        assert_eq!(kernel_below_cpu("neoversen1", None), None);
    }

    #[test]
    fn the_kernel_asked_for_is_the_newest_the_cpu_allows_and_only_where_openblas_fell_behind() {
        use super::kernel_for_cpu;
        assert_eq!(kernel_for_cpu("Prescott", Some("avx512")), Some("SkylakeX"));
        assert_eq!(kernel_for_cpu("Sandybridge", Some("avx2")), Some("Haswell"));
        assert_eq!(kernel_for_cpu("Nehalem", Some("avx512")), Some("SkylakeX"));
        for (k, cpu) in [
            ("Cooperlake", "avx512"),
            ("Zen", "avx512"),
            ("Haswell", "avx2"),
        ] {
            assert_eq!(kernel_for_cpu(k, Some(cpu)), None, "{k} on {cpu}");
        }
        assert_eq!(kernel_for_cpu("Prescott", None), None);
    }

    #[test]
    fn the_note_says_what_tbbench_did_about_an_old_kernel() {
        use super::kernel_note;
        let corrected = kernel_note("SkylakeX (OpenBLAS 0.3.21)", Some("Prescott"), None, true);
        assert_eq!(
            corrected.as_deref(),
            Some("OpenBLAS chose its Prescott kernel, older than this CPU; tbbench set OPENBLAS_CORETYPE=SkylakeX for its own processes")
        );
        let below = "OpenBLAS runs its Prescott kernel on a CPU with AVX-512: ...";
        let stood_in = kernel_note("Prescott", None, Some(below), true).unwrap();
        assert!(
            stood_in.starts_with(below) && stood_in.contains("packed product"),
            "{stood_in}"
        );
        assert_eq!(
            kernel_note("Prescott", None, Some(below), false).as_deref(),
            Some(below)
        );
        assert_eq!(kernel_note("Cooperlake", None, None, true), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The BLAS path (when a BLAS is installed) against the Rust loops, on sizes above the
    /// threshold and with leading dimensions larger than the rows.
    #[test]
    fn blas_and_rust_loops_agree() {
        let (m, n, k, lda) = (70, 50, 40, 80);
        let a: Vec<f64> = (0..lda * k)
            .map(|i| ((i * 37) % 101) as f64 / 101.0 - 0.5)
            .collect();
        let bm: Vec<f64> = (0..k * n)
            .map(|i| ((i * 53) % 97) as f64 / 97.0 - 0.5)
            .collect();
        let mut c1 = vec![1.0; lda * n];
        let mut c2 = c1.clone();
        gemm_minus(m, n, k, &a, lda, &bm, k, &mut c1, lda);
        for j in 0..n {
            for p in 0..k {
                for i in 0..m {
                    c2[j * lda + i] -= a[p * lda + i] * bm[j * k + p];
                }
            }
        }
        let worst = c1
            .iter()
            .zip(&c2)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(
            worst < 1e-12,
            "{worst} (BLAS: {:?})",
            blas().map(|b| &b.name)
        );
        let mut t1: Vec<f64> = bm.clone();
        let mut t2 = bm.clone();
        trsm_unit_lower(k, n, &a, lda, &mut t1, k);
        for j in 0..n {
            for p in 0..k {
                let v = t2[j * k + p];
                for i in p + 1..k {
                    t2[j * k + i] -= a[p * lda + i] * v;
                }
            }
        }
        let worst = t1
            .iter()
            .zip(&t2)
            .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
            .fold(0.0, f64::max);
        assert!(worst < 1e-9, "{worst}");
    }

    /// B read from the rows right above C in the same array gives what gemm_minus gives on
    /// a separate copy of B, with the BLAS (above the threshold) and the Rust loops (below),
    /// and leaves B and the rows past C alone.
    #[test]
    fn gemm_below_reads_b_above_c_in_place() {
        for (m, n, k) in [(70, 50, 40), (5, 3, 4)] {
            let ld = k + m + 3;
            let a: Vec<f64> = (0..m * k)
                .map(|i| ((i * 37) % 101) as f64 / 101.0 - 0.5)
                .collect();
            let bc: Vec<f64> = (0..ld * n)
                .map(|i| ((i * 53) % 97) as f64 / 97.0 - 0.5)
                .collect();
            let mut in_place = bc.clone();
            gemm_minus_below(m, n, k, &a, m, &mut in_place, ld);
            let mut copied = bc.clone();
            let b = bc.clone();
            gemm_minus(m, n, k, &a, m, &b, ld, &mut copied[k..], ld);
            assert_eq!(in_place, copied, "m={m} n={n} k={k}");
            for j in 0..n {
                let col = j * ld;
                assert_eq!(in_place[col..col + k], bc[col..col + k]);
                assert_eq!(in_place[col + k + m..col + ld], bc[col + k + m..col + ld]);
                assert_ne!(in_place[col + k..col + k + m], bc[col + k..col + k + m]);
            }
        }
    }

    #[test]
    fn gemm_matches_a_hand_product() {
        // A = [1 2; 3 4] (column-major [1,3,2,4]), B = [5; 6], C = [10; 20].
        let mut c = [10.0, 20.0];
        gemm_minus(2, 1, 2, &[1.0, 3.0, 2.0, 4.0], 2, &[5.0, 6.0], 2, &mut c, 2);
        assert_eq!(c, [10.0 - 17.0, 20.0 - 39.0]);
    }

    #[test]
    fn triangular_solves_invert_their_products() {
        // L = [1 0; 2 1], U = [2 1; 0 4].
        let l = [1.0, 2.0, 0.0, 1.0];
        let mut b = [3.0, 10.0]; // L·[3, 4]
        trsm_unit_lower(2, 1, &l, 2, &mut b, 2);
        assert_eq!(b, [3.0, 4.0]);
        let u = [2.0, 0.0, 1.0, 4.0];
        let mut x = [10.0, 8.0]; // U·[4, 2]
        trsv_upper(2, &u, 2, &mut x);
        assert_eq!(x, [4.0, 2.0]);
    }
}
