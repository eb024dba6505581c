//! How a run that fails ends every rank cleanly: the control thread raises the abort flag, the
//! transports' waits see it and return an error, the main thread unwinds (closing devices,
//! deregistering memory) and says so, and the process then exits without the C library's
//! destructors. At the bottom of the crate: transports, the rendezvous and the driver all use it.

use anyhow::{bail, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Set by the control thread when the run ends because of another rank (it died, froze or
/// failed): the transports' waits see it and return an error, so this rank's main thread
/// unwinds (closing its devices, deregistering its memory) before the process exits.
static ABORTING: AtomicBool = AtomicBool::new(false);
/// Set by the main thread once its run has ended with an error and everything it opened is
/// closed.
static UNWOUND: AtomicBool = AtomicBool::new(false);
/// How long the control thread gives the main thread to unwind. A wait in a transport sees
/// the abort within milliseconds; a computation (a BLAS call) does not look, and is cut short
/// by the exit.
const UNWIND_WAIT: Duration = Duration::from_secs(2);

/// True once the run is being aborted: a transport's wait then stops with an error.
pub fn aborting() -> bool {
    ABORTING.load(Ordering::Relaxed)
}

/// Err once the run is being aborted, for the transports' wait loops.
pub fn check_abort() -> Result<()> {
    if aborting() {
        bail!("the run was aborted");
    }
    Ok(())
}

/// For the main thread when its run ended with an error, everything it opened now closed:
/// true when the control thread is already ending the run (it names the cause and exits the
/// process; the caller only waits for that).
pub fn main_thread_unwound() -> bool {
    UNWOUND.store(true, Ordering::SeqCst);
    ABORTING.load(Ordering::SeqCst)
}

/// Whether the main thread has unwound (its run ended with an error, everything closed).
pub(crate) fn unwound() -> bool {
    UNWOUND.load(Ordering::SeqCst)
}

/// On the control thread: tells the main thread's transport waits to stop, and waits (a
/// bounded time) for the main thread to unwind, so devices are closed in order before exit.
pub(crate) fn unwind_main_thread() {
    ABORTING.store(true, Ordering::SeqCst);
    let start = Instant::now();
    while !UNWOUND.load(Ordering::SeqCst) && start.elapsed() < UNWIND_WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What to undo before a failing run exits (rank 0's shared-memory segment), set once.
static ON_ABORT: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>> = std::sync::OnceLock::new();

/// Registers the clean-up that runs before this process exits on an aborted run.
pub fn on_abort(f: impl Fn() + Send + Sync + 'static) {
    let _ = ON_ABORT.set(Box::new(f));
}

/// Ends this process from a thread other than the one computing: streams flushed, then
/// `_exit`, skipping atexit handlers. A plain `exit` runs the BLAS library's destructor, which
/// frees buffers its worker threads may be using that moment (rank 0 then dies of SIGSEGV
/// instead of reporting the rank that failed).
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process at once; nothing after it runs.
    unsafe { libc::_exit(code) }
}

/// Runs the clean-up registered with `on_abort`, then `exit_now`: for a rank whose launcher
/// went away.
pub fn abort_and_exit(code: i32) -> ! {
    run_abort_hook();
    exit_now(code)
}

pub(crate) fn run_abort_hook() {
    if let Some(f) = ON_ABORT.get() {
        f();
    }
}
