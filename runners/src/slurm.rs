//! Ranks started by Slurm's `srun`: each task of the step is one rank. Slurm's environment says
//! which (SLURM_PROCID of SLURM_STEP_NUM_TASKS, on node SLURM_NODEID); rank 0 binds the
//! rendezvous and hands the others its offer (token, port, addresses) through PMI's key-value
//! store where srun runs a PMI server (`--mpi=pmi2`, which also speaks PMI-1's wire protocol,
//! spoken here without any library), else through a file only the job's user can read, in a
//! folder the step's nodes share ($TBBENCH_SLURM_DIR, default ~/.tbbench/slurm). From there the
//! run is tbbench's own: rendezvous, heartbeats, transports, rank 0 writing the result.
//!
//! `--slurm` writes the `sbatch` script for a run instead of running it.

use crate::offer::Offer;
use crate::options::RunOptions;
use crate::session::{Bootstrap, Launcher};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The folder for offers when srun gives no PMI (overrides ~/.tbbench/slurm).
pub const ENV_SLURM_DIR: &str = "TBBENCH_SLURM_DIR";
/// PMI's key for rank 0's offer.
const PMI_KEY: &str = "tbbench-offer";
/// Offers older than this in the folder are from runs that ended without removing theirs.
const STALE: Duration = Duration::from_secs(24 * 3600);

/// One task of an srun step, as Slurm's environment describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub node: usize,
    pub job_id: String,
    pub step_id: String,
    /// The step's nodes, Slurm's compressed form (node[01-04]).
    pub nodelist: String,
    /// srun's own port for this step: with the job and step ids, the offer file's name, so a
    /// file left by an earlier lab's job of the same number is never read.
    pub srun_port: String,
}

/// The srun task this process is, when it is one of a step of several tasks. A batch script
/// (no step) and a one-task step are not: tbbench then starts its own ranks there.
pub fn step() -> Result<Option<Step>> {
    step_from(&|k| std::env::var(k).ok())
}

fn step_from(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Step>> {
    let (Some(step_id), Some(procid)) = (env("SLURM_STEP_ID"), env("SLURM_PROCID")) else {
        return Ok(None);
    };
    let number = |k: &str| -> Result<Option<usize>> {
        env(k)
            .map(|v| {
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| anyhow!("{k}={v} is not a number (is this an srun task?)"))
            })
            .transpose()
    };
    let size = match number("SLURM_STEP_NUM_TASKS")? {
        Some(n) => n,
        None => number("SLURM_NTASKS")?.unwrap_or(1),
    };
    if size <= 1 {
        return Ok(None);
    }
    let rank = number("SLURM_PROCID")?.unwrap_or(0);
    if rank >= size {
        bail!("SLURM_PROCID={procid} is not below the step's {size} tasks");
    }
    Ok(Some(Step {
        rank,
        size,
        local_rank: number("SLURM_LOCALID")?.unwrap_or(0),
        node: number("SLURM_NODEID")?.unwrap_or(0),
        job_id: env("SLURM_JOB_ID")
            .or_else(|| env("SLURM_JOBID"))
            .unwrap_or_default(),
        step_id,
        nodelist: env("SLURM_STEP_NODELIST")
            .or_else(|| env("SLURM_NODELIST"))
            .unwrap_or_default(),
        srun_port: env("SLURM_STEP_LAUNCHER_PORT")
            .or_else(|| env("SLURM_SRUN_COMM_PORT"))
            .unwrap_or_default(),
    }))
}

/// Inside a Slurm job but not in a step of several tasks (a batch script, salloc's shell):
/// the job's id, for the note that ranks then start on this node only.
pub fn job_without_step() -> Option<String> {
    std::env::var("SLURM_JOB_ID")
        .ok()
        .filter(|_| step().ok().flatten().is_none())
}

/// This task's bootstrap: rank 0 binds and publishes its offer, the others read it.
pub fn bootstrap(opts: &RunOptions, step: &Step) -> Result<Bootstrap> {
    let pmi = Pmi::connect(opts.timeout)?;
    let via = if pmi.is_some() { "pmi" } else { "file" };
    let (listener, offer, keepalive): (_, _, Option<Box<dyn std::any::Any>>) = match pmi {
        Some(mut pmi) => {
            let (listener, offer) = if step.rank == 0 {
                let (l, o) = Offer::bind(opts)?;
                pmi.put(PMI_KEY, &o.encode())?;
                (Some(l), Some(o))
            } else {
                (None, None)
            };
            pmi.barrier()?;
            let offer = match offer {
                Some(o) => o,
                None => Offer::decode(&pmi.get(PMI_KEY)?)?,
            };
            pmi.finalize();
            (listener, offer, None)
        }
        None => {
            let path = offer_path(step)?;
            if step.rank == 0 {
                let (l, o) = Offer::bind(opts)?;
                publish(&path, &o)?;
                // Removed when the run ends (the file is needed only until every rank joined,
                // and a failing run's is pruned a day later by the next).
                let guard: Box<dyn std::any::Any> = Box::new(RemoveOnDrop(path));
                (Some(l), o, Some(guard))
            } else {
                (None, read_offer(&path, step, opts.timeout)?, None)
            }
        }
    };
    Ok(Bootstrap {
        rank: step.rank,
        size: step.size,
        token: offer.token,
        rdv: (step.rank != 0).then(|| offer.rdv()),
        listener,
        label: None,
        addr: None,
        launched: false,
        launcher: Launcher {
            kind: "slurm".into(),
            job_id: Some(step.job_id.clone()),
            step_id: Some(step.step_id.clone()),
            offer_via: Some(via.into()),
        },
        keepalive,
    })
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The folder offers go in: $TBBENCH_SLURM_DIR, else ~/.tbbench/slurm.
fn offer_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os(ENV_SLURM_DIR).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            anyhow!("srun gave no PMI and HOME is not set: set {ENV_SLURM_DIR} to a folder every node of the job shares, or run srun --mpi=pmi2")
        })?;
    Ok(PathBuf::from(home).join(".tbbench").join("slurm"))
}

fn offer_path(step: &Step) -> Result<PathBuf> {
    Ok(offer_dir()?.join(format!(
        "{}.{}.{}.offer",
        step.job_id, step.step_id, step.srun_port
    )))
}

/// Checks that only this user can read what is in `path` (a folder or file): owned by this
/// user, nothing for the group or others.
fn private(path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if m.uid() != uid || m.mode() & 0o077 != 0 {
        bail!(
            "{} can be read by other users (owner uid {}, mode {:o}): the session token would leak; chmod 700 it, or set {ENV_SLURM_DIR} to a folder of your own",
            path.display(),
            m.uid(),
            m.mode() & 0o777
        );
    }
    Ok(())
}

/// Rank 0 writes its offer, whole (a temporary name, then renamed), readable by the user alone.
fn publish(path: &Path, offer: &Offer) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().expect("an offer path has a folder");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    private(dir)?;
    prune(dir);
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    writeln!(f, "{}", offer.encode())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Removes offers left by runs that ended without removing theirs.
fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE);
        if old && e.file_name().to_string_lossy().ends_with(".offer") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Another rank waits for rank 0's offer file (as long as rank 0 waits for the ranks).
fn read_offer(path: &Path, step: &Step, timeout: Duration) -> Result<Offer> {
    let deadline = Instant::now() + timeout;
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) if text.ends_with('\n') => {
                private(path)?;
                return Offer::decode(&text);
            }
            _ if Instant::now() >= deadline => bail!(
                "rank {} (node {}) found no rendezvous offer from rank 0 at {} within {} s: srun gave no PMI, so the folder must be one every node of the job shares (set {ENV_SLURM_DIR}), or run srun --mpi=pmi2",
                step.rank,
                crate::sysinfo::this_host().hostname,
                path.display(),
                timeout.as_secs()
            ),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A client of PMI-1's wire protocol on the socket srun's PMI server hands each task
/// (PMI_FD): put, barrier, get. Slurm's mpi/pmi2 plugin and MPICH's hydra speak it.
struct Pmi {
    stream: std::os::unix::net::UnixStream,
    reader: BufReader<std::os::unix::net::UnixStream>,
    kvs: String,
}

impl Pmi {
    /// None where this task has no PMI server (srun without --mpi=pmi2, or --mpi=pmix).
    fn connect(timeout: Duration) -> Result<Option<Pmi>> {
        use std::os::unix::io::FromRawFd;
        let Some(fd) = std::env::var("PMI_FD")
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok())
        else {
            return Ok(None);
        };
        // SAFETY: PMI_FD names a socket srun's step daemon opened for this process alone; it
        // is not otherwise used by this process. A descriptor that is not a socket fails the
        // first write, named below.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Ok(None);
        }
        let stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        let reader = BufReader::new(stream.try_clone()?);
        let mut pmi = Pmi {
            stream,
            reader,
            kvs: String::new(),
        };
        pmi.ask(
            "cmd=init pmi_version=1 pmi_subversion=1",
            "response_to_init",
        )?;
        let named = pmi.ask("cmd=get_my_kvsname", "my_kvsname")?;
        pmi.kvs = field(&named, "kvsname")
            .ok_or_else(|| anyhow!("srun's PMI server named no key-value store ('{named}')"))?
            .to_string();
        Ok(Some(pmi))
    }

    /// Sends one command and reads its answer, which must be `want` with rc=0.
    fn ask(&mut self, cmd: &str, want: &str) -> Result<String> {
        self.stream
            .write_all(format!("{cmd}\n").as_bytes())
            .with_context(|| format!("srun's PMI server (PMI_FD) did not take '{cmd}'"))?;
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .with_context(|| format!("srun's PMI server did not answer '{cmd}'"))?;
        if n == 0 {
            bail!("srun's PMI server closed the connection at '{cmd}'");
        }
        let line = line.trim().to_string();
        if field(&line, "cmd") != Some(want) || field(&line, "rc").is_some_and(|rc| rc != "0") {
            bail!("srun's PMI server answered '{line}' to '{cmd}'");
        }
        Ok(line)
    }

    fn put(&mut self, key: &str, value: &str) -> Result<()> {
        let cmd = format!("cmd=put kvsname={} key={key} value={value}", self.kvs);
        self.ask(&cmd, "put_result").map(|_| ())
    }

    /// Every task of the step reaches it (bounded by the read timeout: the run's --timeout).
    fn barrier(&mut self) -> Result<()> {
        self.ask("cmd=barrier_in", "barrier_out")
            .context("not every task of the step reached PMI's barrier")
            .map(|_| ())
    }

    fn get(&mut self, key: &str) -> Result<String> {
        let cmd = format!("cmd=get kvsname={} key={key}", self.kvs);
        let line = self.ask(&cmd, "get_result")?;
        field(&line, "value")
            .map(str::to_string)
            .ok_or_else(|| anyhow!("srun's PMI server gave no value for {key} ('{line}')"))
    }

    fn finalize(mut self) {
        let _ = self.ask("cmd=finalize", "finalize_ack");
    }
}

/// `key=value` out of a PMI-1 line of space-separated pairs.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// `--slurm[=FILE]`: the sbatch script for this command line, printed or written (whole, or
/// not at all); nothing runs. Exit 0.
pub fn write_script(opts: &RunOptions, suite: &str, to: &Path) -> Result<i32> {
    if opts.over.len() > 1 {
        bail!("--slurm with several networks of --over: srun starts the ranks once, so write one script per network");
    }
    let argv: Vec<String> = std::env::args().collect();
    let after = argv
        .iter()
        .position(|a| a == suite)
        .map_or(&argv[argv.len().min(1)..], |i| &argv[i + 1..]);
    let exe = std::env::current_exe().context("cannot find tbbench's own path")?;
    let script = sbatch_script(suite, &exe, &script_args(after), opts.nodes);
    if to == Path::new("-") {
        print!("{script}");
    } else {
        tbbench_schema::write::write_atomic(to, script.as_bytes())
            .with_context(|| format!("cannot write {}", to.display()))?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755));
        eprintln!(
            "tbbench: wrote {} ({} ranks); submit it with `sbatch {}`",
            to.display(),
            opts.nodes,
            to.display()
        );
    }
    Ok(0)
}

/// The `sbatch` script for a run: the same flags, each rank an srun task. `args` is the
/// command line as given (after the binary), `--slurm` and rank placement flags left out.
pub fn sbatch_script(suite: &str, exe: &Path, args: &[String], ranks: usize) -> String {
    let quoted: Vec<String> = args.iter().map(|a| crate::launch::sh_quote(a)).collect();
    format!(
        "#!/bin/bash\n\
         # tbbench {suite} on {ranks} Slurm tasks, one rank each: submit with `sbatch FILE`.\n\
         # Written by `tbbench {suite} --slurm`. Ranks meet at rank 0 (the step's first task)\n\
         # and its result file is written in the submit directory. srun --mpi=pmi2 hands the\n\
         # session token over PMI; without it tbbench uses ~/.tbbench/slurm, which every node\n\
         # must share (or set TBBENCH_SLURM_DIR).\n\
         #SBATCH --job-name=tbbench-{suite}\n\
         #SBATCH --ntasks={ranks}\n\
         #SBATCH --output=tbbench-{suite}-%j.out\n\
         # One rank per node, as between-host figures want (leave out to pack them):\n\
         ##SBATCH --ntasks-per-node=1\n\
         ##SBATCH --time=00:30:00\n\
         \n\
         srun --mpi=pmi2 {} {suite} {}\n",
        crate::launch::sh_quote(&exe.to_string_lossy()),
        quoted.join(" ")
    )
}

/// The suite's flags with `--slurm` and what Slurm decides (--nodes, --hostfile, --rsh, --exe)
/// taken out: the rest of the command line goes into the script as given.
pub fn script_args(args: &[String]) -> Vec<String> {
    const WITH_VALUE: [&str; 4] = ["--nodes", "--hostfile", "--rsh", "--exe"];
    let mut out = Vec::new();
    let mut skip_next = false;
    for a in args {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        let name = a.split('=').next().unwrap_or(a);
        if name == "--slurm" {
            continue;
        }
        if WITH_VALUE.contains(&name) {
            skip_next = !a.contains('=');
            continue;
        }
        out.push(a.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn an_srun_task_is_a_rank_and_a_batch_script_is_not() {
        let task = env_of(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "2"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_NODELIST", "n[1-2]"),
            ("SLURM_STEP_LAUNCHER_PORT", "40197"),
        ]);
        let s = step_from(&task).unwrap().unwrap();
        assert_eq!((s.rank, s.size, s.local_rank, s.node), (2, 4, 1, 1));
        assert_eq!((s.job_id.as_str(), s.nodelist.as_str()), ("77", "n[1-2]"));
        // sbatch's script: the job's variables, no step.
        let batch = env_of(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_JOB_ID", "5"),
        ]);
        assert_eq!(step_from(&batch).unwrap(), None);
        // srun -n 1: tbbench starts its own ranks.
        let one = env_of(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_NUM_TASKS", "1"),
        ]);
        assert_eq!(step_from(&one).unwrap(), None);
        let bad = env_of(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "x"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ]);
        assert!(step_from(&bad)
            .unwrap_err()
            .to_string()
            .contains("SLURM_PROCID=x"));
        let over = env_of(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "2"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ]);
        assert!(step_from(&over).is_err());
    }

    #[test]
    fn pmi_lines_are_read_by_key() {
        let l = "cmd=get_result rc=0 value=abc-1-10.0.0.1";
        assert_eq!(field(l, "cmd"), Some("get_result"));
        assert_eq!(field(l, "value"), Some("abc-1-10.0.0.1"));
        assert_eq!(field(l, "val"), None);
    }

    #[test]
    fn the_script_keeps_the_flags_and_leaves_placement_to_slurm() {
        let args: Vec<String> = [
            "--sizes",
            "1..4MiB",
            "--nodes",
            "4",
            "--slurm=x.sh",
            "--hostfile=h",
            "--out",
            "a b.json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let kept = script_args(&args);
        assert_eq!(kept, ["--sizes", "1..4MiB", "--out", "a b.json"]);
        let s = sbatch_script("link", Path::new("/opt/tb/tbbench"), &kept, 4);
        assert!(s.starts_with("#!/bin/bash\n"), "{s}");
        assert!(s.contains("#SBATCH --ntasks=4\n"), "{s}");
        assert!(
            s.contains("srun --mpi=pmi2 /opt/tb/tbbench link --sizes 1..4MiB --out 'a b.json'\n"),
            "{s}"
        );
    }

    #[test]
    fn an_offer_file_is_private_and_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tbbench-slurm-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let step = Step {
            rank: 1,
            size: 2,
            local_rank: 0,
            node: 0,
            job_id: "9".into(),
            step_id: "0".into(),
            nodelist: "vm".into(),
            srun_port: "1".into(),
        };
        let path = dir.join("9.0.1.offer");
        let offer = Offer {
            token: crate::session::Token([3; 16]),
            port: 5,
            addrs: vec!["127.0.0.1".into()],
        };
        publish(&path, &offer).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            read_offer(&path, &step, Duration::from_secs(1)).unwrap(),
            offer
        );
        // Readable by others: refused, naming the file and what to do.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_offer(&path, &step, Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("other users") && e.contains("9.0.1.offer"),
            "{e}"
        );
        // Never written: the wait ends, naming the folder that must be shared.
        let e = read_offer(&dir.join("none.offer"), &step, Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TBBENCH_SLURM_DIR") && e.contains("rank 1"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
