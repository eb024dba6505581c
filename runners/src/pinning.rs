//! Binding a rank to one CPU where more ranks share a host than it has cores.
//!
//! With ranks beyond the cores, a collective's small-message time is a count of scheduler
//! hand-offs (each a yield to the rank sharing the core), and which ranks share a core
//! decides that count. Left to the scheduler, the sharing changes from one launch to the next
//! and with it the figure; dealt round-robin, one CPU each, it reads the same in every launch
//! (re-measure: `tbbench coll --nodes 4 --sizes 8` launched a few times on a 2-core host).
//! Ranks that another tool has already placed (mpirun's binding, taskset, a cpuset narrower
//! than the host) keep their placement.

/// The CPU this rank was bound to, or None where it was left alone: ranks fit the cores, the
/// process may not run on every CPU of the host (someone else placed it), or the OS has no
/// per-CPU binding (macOS offers only hints).
///
/// `local` is this rank's position among the `ranks_here` ranks on its host, `cores` the
/// host's online CPUs. Binds the calling thread; threads it starts later inherit the binding.
pub fn pin_when_oversubscribed(local: usize, ranks_here: usize, cores: usize) -> Option<usize> {
    if ranks_here <= cores {
        return None;
    }
    let cpus = os::allowed_cpus()?;
    let cpu = choose(&cpus, cores, local)?;
    os::bind(cpu).then_some(cpu)
}

/// The CPU for the `local`-th rank on a host whose every CPU (`cores` of them) this process
/// may use; None where the allowed set is narrower.
fn choose(allowed: &[usize], cores: usize, local: usize) -> Option<usize> {
    if allowed.is_empty() || allowed.len() < cores {
        return None;
    }
    Some(allowed[local % allowed.len()])
}

#[cfg(target_os = "linux")]
mod os {
    /// The CPUs this thread may run on, in ascending order.
    pub fn allowed_cpus() -> Option<Vec<usize>> {
        // SAFETY: cpu_set_t is plain bits; sched_getaffinity writes at most its size.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return None;
        }
        // SAFETY: CPU_ISSET reads the set within CPU_SETSIZE.
        Some(
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect(),
        )
    }

    pub fn bind(cpu: usize) -> bool {
        // SAFETY: as above; the set names one CPU the thread was already allowed on.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(cpu, &mut set) };
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    pub fn allowed_cpus() -> Option<Vec<usize>> {
        None
    }
    pub fn bind(_cpu: usize) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_dealt_round_robin_over_the_cpus() {
        let all = [0, 1];
        let cpus: Vec<_> = (0..4).map(|l| choose(&all, 2, l)).collect();
        assert_eq!(cpus, [Some(0), Some(1), Some(0), Some(1)]);
    }

    #[test]
    fn a_placement_made_by_someone_else_is_kept() {
        // mpirun bound this rank to core 3 of 8: not ours to move.
        assert_eq!(choose(&[3], 8, 5), None);
        assert_eq!(choose(&[], 8, 0), None);
    }

    #[test]
    fn ranks_that_fit_the_cores_are_not_bound() {
        assert_eq!(pin_when_oversubscribed(1, 2, 2), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn binding_takes_effect_on_the_calling_thread() {
        // On a thread of its own, so the test harness's other threads keep their CPUs.
        std::thread::spawn(|| {
            let before = os::allowed_cpus().unwrap();
            let cores = before.len();
            let local = cores; // the (cores+1)-th rank: wraps to the first CPU
            let got = pin_when_oversubscribed(local, cores + 1, cores);
            assert_eq!(got, Some(before[0]));
            assert_eq!(os::allowed_cpus().unwrap(), vec![before[0]]);
        })
        .join()
        .unwrap();
    }
}
