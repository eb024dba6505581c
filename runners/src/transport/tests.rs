//! Both transports moving real bytes between ranks (threads of this process, each with its own
//! transport), in the shapes the suites use: windows, both directions at once, messages larger
//! than the shm ring, odd sizes, striping over several TCP connections, and every shm path
//! (mailbox slot, ring, process_vm_readv, mapped shared buffer).

use super::shm::{create_segment, ShmTransport};
use super::tcp::{bind_listener, connect_mesh, one_network, TcpOptions, TcpTransport};
#[cfg(target_os = "linux")]
use super::Traffic;
use super::{Buffer, PeerName, RecvOp, SendOp, Transport, Waiting};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// 262_136 and 262_150: a header and its data end at, and just past, a send slice (256 KiB).
const SIZES: [usize; 10] = [
    0,
    1,
    7,
    100,
    4096,
    65536,
    262_136,
    262_150,
    300_000,
    5 << 20,
];

fn names(n: usize) -> Vec<PeerName> {
    (0..n)
        .map(|rank| PeerName {
            rank,
            host: "test".into(),
        })
        .collect()
}

fn pattern(len: usize, from: usize, salt: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (from * 7 + salt * 13)) as u8)
        .collect()
}

/// Rank `me` and rank `peer` both send every size to each other at once, in one window, from
/// plain memory and from transport-allocated memory, and check what arrives.
fn swap_all_sizes(t: &mut dyn Transport, peer: usize) {
    let me = t.rank();
    for alloc in [false, true] {
        let outgoing: Vec<Vec<u8>> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, me, i))
            .collect();
        let mut owned: Vec<Buffer> = Vec::new();
        if alloc {
            for o in &outgoing {
                let mut b = t.alloc(o.len()).unwrap();
                b.copy_from_slice(o);
                owned.push(b);
            }
        }
        let sends: Vec<SendOp> = if alloc {
            owned.iter().map(|b| SendOp { peer, buf: b }).collect()
        } else {
            outgoing.iter().map(|o| SendOp { peer, buf: o }).collect()
        };
        let mut incoming: Vec<Vec<u8>> = SIZES.iter().map(|&n| vec![0u8; n]).collect();
        let mut recvs: Vec<RecvOp> = incoming
            .iter_mut()
            .map(|b| RecvOp { peer, buf: b })
            .collect();
        t.exchange(&sends, &mut recvs).unwrap();
        for (i, got) in incoming.iter().enumerate() {
            assert!(
                got == &pattern(SIZES[i], peer, i),
                "rank {me}: message {i} ({} bytes) from {peer} arrived wrong (alloc={alloc})",
                SIZES[i]
            );
        }
    }
}

/// Two tcp ranks on loopback, each running `body` on its own thread; returns their results.
fn tcp_pair<T: Send + 'static>(
    streams: usize,
    timeout: Duration,
    body: fn(&mut dyn Transport, usize) -> T,
) -> Vec<T> {
    tcp_pair_spinning(streams, timeout, super::tcp::SPIN_BEFORE_POLL, body)
}

/// `tcp_pair` whose waits spin for `spin` before they sleep.
fn tcp_pair_spinning<T: Send + 'static>(
    streams: usize,
    timeout: Duration,
    spin: Duration,
    body: fn(&mut dyn Transport, usize) -> T,
) -> Vec<T> {
    let opts = TcpOptions {
        timeout,
        spin,
        ..test_options(streams)
    };
    tcp_pair_with(opts, move |t, peer| body(t, peer))
}

/// The options the tcp tests start from: `streams` connections per pair, a 20 s timeout, the
/// OS's buffers and congestion control, one-way messages unstriped.
fn test_options(streams: usize) -> TcpOptions {
    TcpOptions {
        streams,
        timeout: Duration::from_secs(20),
        sockbuf: None,
        congestion: None,
        spin: super::tcp::SPIN_OVERSUBSCRIBED,
        // Test threads may outnumber the cores.
        yield_while_spinning: true,
        stripe_one_way: false,
    }
}

/// Two tcp ranks on loopback with these options, each running `body` on its own thread.
fn tcp_pair_with<T, F>(opts: TcpOptions, body: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(&mut TcpTransport, usize) -> T + Send + Clone + 'static,
{
    let listeners: Vec<_> = (0..2)
        .map(|_| bind_listener(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let (addrs, opts, body) = (addrs.clone(), opts.clone(), body.clone());
            std::thread::spawn(move || {
                let mut t = connect_mesh(
                    rank,
                    l,
                    &one_network(rank, &addrs, Some(IpAddr::V4(Ipv4Addr::LOCALHOST))),
                    &[9u8; 16],
                    names(2),
                    opts,
                )
                .unwrap();
                body(&mut t, 1 - rank)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn tcp_moves_every_size_both_ways_with_one_and_three_streams() {
    for streams in [1, 3] {
        tcp_pair(streams, Duration::from_secs(20), |t, peer| {
            swap_all_sizes(t, peer)
        });
    }
}

/// Bytes the kernel has taken in on a connection: tcp_info's tcpi_bytes_received (Linux 4.1+),
/// read at its offset in the kernel's struct, since the C library's ends before it.
#[cfg(target_os = "linux")]
fn bytes_received(fd: i32) -> u64 {
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: the buffer and its length are valid for the kernel to fill.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert!(rc == 0 && len >= 136, "TCP_INFO: rc {rc}, {len} bytes");
    u64::from_ne_bytes(info[128..136].try_into().unwrap())
}

/// Three connections per pair: a one-way message ([`Traffic::OneWay`]) crosses on the first
/// alone unless striping one-way messages was asked for, a message in the default mode on all
/// three; every size still arrives whole both ways in each mode and after each switch (the
/// kernel's byte counts of the receiving rank's connections).
#[cfg(target_os = "linux")]
#[test]
fn tcp_carries_one_way_messages_on_one_connection_unless_asked_to_stripe() {
    const LEN: usize = 4 << 20;
    for stripe_one_way in [false, true] {
        let opts = TcpOptions {
            stripe_one_way,
            ..test_options(3)
        };
        let results = tcp_pair_with(opts, |t, peer| {
            let mut per_mode = Vec::new();
            let modes = [Traffic::OneWay, Traffic::Both, Traffic::OneWay];
            for (i, traffic) in modes.into_iter().enumerate() {
                t.set_traffic(traffic);
                let message = pattern(LEN, 0, i);
                if t.rank() == 0 {
                    // Sent once rank 1 has read its counters.
                    t.recv(peer, &mut [0u8; 1]).unwrap();
                    t.send(peer, &message).unwrap();
                } else {
                    let counts = |t: &TcpTransport| -> Vec<u64> {
                        t.stream_fds(peer).into_iter().map(bytes_received).collect()
                    };
                    let before = counts(t);
                    t.send(peer, &[1u8]).unwrap();
                    let mut got = vec![0u8; LEN];
                    t.recv(peer, &mut got).unwrap();
                    assert!(got == message, "{traffic:?}: the message arrived wrong");
                    let after = counts(t);
                    per_mode.push(
                        after
                            .iter()
                            .zip(&before)
                            .map(|(a, b)| a - b)
                            .collect::<Vec<u64>>(),
                    );
                }
                swap_all_sizes(t, peer);
            }
            per_mode
        });
        let got = &results[1];
        let striped = |bytes: &[u64]| bytes.iter().all(|&b| b >= (LEN / 4) as u64);
        let alone = |bytes: &[u64]| bytes[0] >= LEN as u64 && bytes[1..].iter().all(|&b| b == 0);
        assert!(
            striped(&got[1]),
            "both ways: bytes per connection {:?}",
            got[1]
        );
        for one_way in [&got[0], &got[2]] {
            assert!(
                if stripe_one_way {
                    striped(one_way)
                } else {
                    alone(one_way)
                },
                "one way (striping asked for: {stripe_one_way}): bytes per connection {one_way:?}"
            );
        }
    }
}

/// A socket buffer size reaches every data connection in both directions (Linux reports
/// twice what it granted: its bookkeeping's share; it grants up to net.core.wmem_max and
/// rmem_max), the transport records what was granted, and messages larger than it still
/// arrive whole.
#[cfg(target_os = "linux")]
#[test]
fn tcp_fixed_socket_buffers_reach_every_connection() {
    const ASKED: usize = 256 << 10;
    let opts = TcpOptions {
        sockbuf: Some(ASKED),
        ..test_options(2)
    };
    let results = tcp_pair_with(opts, |t, peer| {
        swap_all_sizes(t, peer);
        let option = |fd: i32, name: libc::c_int| {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: an int and its length for the kernel to fill.
            let rc = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    name,
                    (&mut v as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            v as usize
        };
        let per_connection: Vec<_> = t
            .stream_fds(peer)
            .into_iter()
            .flat_map(|fd| [option(fd, libc::SO_SNDBUF), option(fd, libc::SO_RCVBUF)])
            .collect();
        (t.sockbuf_granted(), per_connection)
    });
    for (granted, per_connection) in results {
        let granted = granted.expect("a granted size where one was set");
        assert!(
            granted > 0 && granted <= ASKED,
            "granted {granted} of {ASKED}"
        );
        assert_eq!(per_connection, vec![2 * granted; 4], "granted {granted}");
    }
}

/// Two ends that cut a message differently over their connections (one told its traffic goes
/// one way, the other not) fail in one line naming the peer, rather than read one piece's
/// bytes as another's.
#[cfg(target_os = "linux")]
#[test]
fn tcp_names_ends_that_stripe_a_message_differently() {
    let results = tcp_pair(2, Duration::from_secs(5), |t, peer| {
        let message = vec![7u8; 1 << 20];
        if t.rank() == 0 {
            t.set_traffic(Traffic::OneWay);
            // Rank 1 stops at the first header and closes its connections, so this send may
            // end either way.
            let _ = t.send(peer, &message);
            None
        } else {
            let mut got = vec![0u8; message.len()];
            Some(t.recv(peer, &mut got).unwrap_err().to_string())
        }
    });
    let err = results[1].clone().unwrap();
    assert!(
        err.contains("rank 0") && err.contains("into 1 piece(s)") && err.contains("into 2"),
        "{err}"
    );
}

#[test]
fn tcp_names_a_size_mismatch() {
    let results = tcp_pair(1, Duration::from_secs(5), |t, peer| {
        if t.rank() == 0 {
            t.send(peer, &[0u8; 10]).unwrap();
            None
        } else {
            Some(t.recv(peer, &mut [0u8; 12]).unwrap_err().to_string())
        }
    });
    let err = results[1].clone().unwrap();
    assert!(
        err.contains("size mismatch")
            && err.contains("10")
            && err.contains("12")
            && err.contains("rank 0"),
        "{err}"
    );
}

fn shm_pair<T: Send + 'static>(token: [u8; 16], body: fn(&mut ShmTransport, usize) -> T) -> Vec<T> {
    shm_pair_timing_out(token, Duration::from_secs(20), body)
}

/// Two shm ranks, each running `body` on its own thread, their waits giving up after
/// `timeout`; returns their results.
fn shm_pair_timing_out<T: Send + 'static>(
    token: [u8; 16],
    timeout: Duration,
    body: fn(&mut ShmTransport, usize) -> T,
) -> Vec<T> {
    create_segment(&token, 2).unwrap();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut t = ShmTransport::attach(rank, 2, &token, names(2), timeout).unwrap();
                body(&mut t, 1 - rank)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn shm_moves_every_size_both_ways_through_every_path() {
    // Sizes above the 2 MiB ring stream through it in pieces; plain memory takes the
    // process_vm_readv path, alloc'd memory the mapped path (where the probe allows them).
    shm_pair([3u8; 16], |t, peer| swap_all_sizes(t, peer));
    let leftover =
        std::path::Path::new("/dev/shm").join(&super::shm::segment_name(&[3u8; 16])[1..]);
    assert!(
        !leftover.exists(),
        "segment name must be removed once every rank attached"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn shm_reads_more_shared_buffers_than_it_keeps_mapped() {
    // 300 buffers of 2 KiB (past a mailbox slot: the mapped path), sent twice over: the
    // receiver's cache of mappings stays bounded, and a buffer whose mapping it dropped is
    // mapped again and read right. (Both ranks are threads of this process, so the one-copy
    // probe passes whatever the host's ptrace rules.)
    shm_pair([7u8; 16], |t, peer| {
        const BUFFERS: usize = 300;
        const LEN: usize = 2048;
        if t.rank() == 0 {
            let mut bufs: Vec<Buffer> = (0..BUFFERS).map(|_| t.alloc(LEN).unwrap()).collect();
            assert!(
                bufs[0].region().is_some(),
                "alloc must hand out shared memory"
            );
            for round in 0..2 {
                for (i, b) in bufs.iter_mut().enumerate() {
                    b.copy_from_slice(&pattern(LEN, round, i));
                    t.send(peer, b).unwrap();
                }
            }
        } else {
            let mut got = vec![0u8; LEN];
            for round in 0..2 {
                for i in 0..BUFFERS {
                    t.recv(peer, &mut got).unwrap();
                    assert!(got == pattern(LEN, round, i), "round {round}: buffer {i}");
                }
            }
            let mapped = t.mapped_regions();
            assert!(
                (1..=256).contains(&mapped),
                "{mapped} regions mapped, 256 at most"
            );
        }
    });
}

#[test]
fn shm_names_a_size_mismatch() {
    // 10 bytes travel in a mailbox slot, 5000 through the ring: both paths check the size.
    shm_pair([4u8; 16], |t, peer| {
        if t.rank() == 0 {
            t.send(peer, &[1u8; 10]).unwrap();
        } else {
            let err = t.recv(peer, &mut [0u8; 12]).unwrap_err().to_string();
            assert!(
                err.contains("size mismatch") && err.contains("10") && err.contains("12"),
                "{err}"
            );
        }
    });
    shm_pair([5u8; 16], |t, peer| {
        if t.rank() == 0 {
            t.send(peer, &[1u8; 5000]).unwrap();
        } else {
            let err = t.recv(peer, &mut [0u8; 5001]).unwrap_err().to_string();
            assert!(
                err.contains("size mismatch") && err.contains("5000") && err.contains("5001"),
                "{err}"
            );
        }
    });
}

/// Sizes on both sides of the mailbox slot's limit (1072 bytes), and one for the one-copy
/// path (64 KiB and up), in an irregular order.
fn mixed_size(i: usize) -> usize {
    [0, 8, 1072, 1073, 3, 4096, 1000, 70_000, 1][i % 9] + (i * 7) % 5
}

#[test]
fn shm_keeps_order_when_a_sender_runs_far_ahead() {
    // Rank 0 sends 200 messages before rank 1 posts a receive: the mailbox's 32 slots fill
    // and the rest go through the ring (the one-copy ones wait there for rank 1's reads), and
    // rank 1 must still take them in order, whichever path each took. Then both directions at once, in windows of 50, many times round the
    // slots, so a stale slot from an earlier lap would show as a wrong message.
    shm_pair([6u8; 16], |t, peer| {
        let me = t.rank();
        let msgs: Vec<Vec<u8>> = (0..200).map(|i| pattern(mixed_size(i), 0, i)).collect();
        if me == 0 {
            let sends: Vec<SendOp> = msgs.iter().map(|m| SendOp { peer, buf: m }).collect();
            t.exchange(&sends, &mut []).unwrap();
        } else {
            std::thread::sleep(Duration::from_millis(100));
            for half in [0..100, 100..200] {
                let mut got: Vec<Vec<u8>> =
                    half.clone().map(|i| vec![9u8; mixed_size(i)]).collect();
                let mut recvs: Vec<RecvOp> =
                    got.iter_mut().map(|b| RecvOp { peer, buf: b }).collect();
                t.exchange(&[], &mut recvs).unwrap();
                for (i, g) in half.zip(&got) {
                    assert!(
                        g == &msgs[i],
                        "message {i} ({} bytes) arrived wrong",
                        g.len()
                    );
                }
            }
        }
        for round in 0..20 {
            let out: Vec<Vec<u8>> = (0..50)
                .map(|i| pattern(mixed_size(i + round), me, i + round))
                .collect();
            let sends: Vec<SendOp> = out.iter().map(|m| SendOp { peer, buf: m }).collect();
            let mut got: Vec<Vec<u8>> = (0..50).map(|i| vec![9u8; mixed_size(i + round)]).collect();
            let mut recvs: Vec<RecvOp> = got.iter_mut().map(|b| RecvOp { peer, buf: b }).collect();
            t.exchange(&sends, &mut recvs).unwrap();
            for (i, g) in got.iter().enumerate() {
                assert!(
                    g == &pattern(mixed_size(i + round), peer, i + round),
                    "round {round}: message {i} from {peer} arrived wrong"
                );
            }
        }
    });
}

/// `--streams` left to the run: the suite's count (two by default) where the connections will
/// pace every segment (the congestion control asked for, or else any host's default), one
/// otherwise, and the same answer on every rank (it reads only the shared table).
#[test]
fn auto_streams_follow_the_congestion_control_the_connections_will_run() {
    use super::tcp::auto_streams;
    use crate::options::AUTO_STREAMS_PACED;
    let table = |defaults: &[Option<&str>]| -> Vec<crate::session::RankInfo> {
        defaults
            .iter()
            .enumerate()
            .map(|(rank, cc)| crate::session::RankInfo {
                rank,
                hostname: format!("h{rank}"),
                label: format!("h{rank}"),
                data_ip: None,
                data_port: 0,
                pid: 1,
                boot_id: String::new(),
                host: tbbench_schema::Host {
                    tcp_congestion_control: cc.map(String::from),
                    ..Default::default()
                },
                rdma: None,
                links: None,
            })
            .collect()
    };
    let cubic = table(&[Some("cubic"), Some("cubic")]);
    let mixed = table(&[Some("cubic"), Some("bbr")]);
    let unknown = table(&[None, None]);
    let p = AUTO_STREAMS_PACED;
    assert_eq!(auto_streams(&cubic, None, p), 1);
    assert_eq!(auto_streams(&mixed, None, p), AUTO_STREAMS_PACED);
    assert_eq!(auto_streams(&unknown, None, p), 1);
    // Asked for, it is what every connection runs, whatever the hosts' defaults.
    assert_eq!(auto_streams(&mixed, Some("cubic"), p), 1);
    assert_eq!(auto_streams(&cubic, Some("bbr"), p), AUTO_STREAMS_PACED);
    const { assert!(AUTO_STREAMS_PACED > 1) };
    // A suite of one-way streams keeps one connection even where the connections pace.
    assert_eq!(auto_streams(&cubic, Some("bbr"), 1), 1);
    assert_eq!(auto_streams(&mixed, None, 1), 1);
}

/// Waits that sleep at once ([`Waiting::Beside`], HPL's broadcast beside its update) move the
/// same bytes, see a message that comes late, and still give up after the timeout.
fn beside_a_computation(t: &mut dyn Transport, peer: usize) -> Option<String> {
    t.set_waiting(Waiting::Beside);
    swap_all_sizes(t, peer);
    let late = pattern(300_000, 0, 1);
    if t.rank() == 0 {
        std::thread::sleep(Duration::from_millis(300));
        t.send(peer, &late).unwrap();
        // Rank 1's next receive waits for a message that never comes; this rank stays
        // connected past rank 1's timeout, so what ends that wait is the timeout.
        std::thread::sleep(Duration::from_secs(2));
        None
    } else {
        let mut got = vec![0u8; late.len()];
        t.recv(peer, &mut got).unwrap();
        assert!(got == late, "the late message arrived wrong");
        Some(t.recv(peer, &mut [0u8; 8]).unwrap_err().to_string())
    }
}

#[test]
fn tcp_waits_beside_a_computation_move_every_size_and_time_out() {
    let results = tcp_pair(1, Duration::from_secs(1), beside_a_computation);
    let err = results[1].clone().unwrap();
    assert!(err.contains("timed out") && err.contains("rank 0"), "{err}");
}

#[test]
fn shm_waits_beside_a_computation_move_every_size_and_time_out() {
    let results = shm_pair_timing_out([8u8; 16], Duration::from_secs(1), |t, peer| {
        beside_a_computation(t, peer)
    });
    let err = results[1].clone().unwrap();
    assert!(err.contains("timed out") && err.contains("rank 0"), "{err}");
}

/// CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A 300 ms wait for a message, with the spin before poll set longer than that: spinning, the
/// waiting thread keeps its core busy all along; beside a computation it leaves the core at
/// once. Each rank's CPU time for the wait, Spin then Beside.
#[test]
fn tcp_waits_beside_a_computation_leave_the_core() {
    let results = tcp_pair_spinning(
        1,
        Duration::from_secs(10),
        Duration::from_secs(5),
        |t, peer| {
            let mut used = Vec::new();
            for waiting in [Waiting::Spin, Waiting::Beside] {
                t.set_waiting(waiting);
                if t.rank() == 0 {
                    std::thread::sleep(Duration::from_millis(300));
                    t.send(peer, &[1u8; 8]).unwrap();
                    // Rank 1 is ready for the next wait.
                    t.recv(peer, &mut [0u8; 1]).unwrap();
                } else {
                    let before = thread_cpu();
                    t.recv(peer, &mut [0u8; 8]).unwrap();
                    used.push(thread_cpu() - before);
                    t.send(peer, &[0u8; 1]).unwrap();
                }
            }
            used
        },
    );
    let (spin, beside) = (results[1][0], results[1][1]);
    assert!(
        beside * 4 < spin,
        "the waiting thread used {beside:?} of CPU beside a computation, {spin:?} spinning"
    );
}
