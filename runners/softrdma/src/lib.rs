//! A software RDMA device: the ibverbs entry points and struct layouts that libibverbs.so.1
//! (and macOS's librdma.dylib) export, implemented over TCP, so tbbench's verbs transport runs
//! on machines without RDMA hardware. Load it with `tbbench ... --transport verbs --verbs-lib
//! target/<profile>/libtbbench_softrdma.so`.
//!
//! Two devices, two rule sets ([`rules`]): `softrdma_apple0` behaves as Apple's Thunderbolt
//! RDMA on macOS 26.2+ is documented and measured to (UC only, SEND/RECV only, MTU 1024,
//! SEND and RECV of the same number of 4 KiB frames, unmatched SENDs dropped silently, 100
//! memory regions, 10 queue pairs and 32 outstanding frames per queue), `softrdma_linux0` as a
//! ConnectX NIC under rdma-core (RC and UC, RDMA WRITE with immediate). What a device dropped
//! and refused is counted; `TBBENCH_SOFTRDMA_STATS=DIR` writes the counts to a JSON file per
//! device when it is closed, and `softrdma_counters_json` returns them at any time.
//!
//! Figures measured over it are a software stand-in's, never RDMA's: tbbench labels them
//! `rdma-emulated`.
//!
//! Every exported function catches panics (none should happen) and reports them as the C API
//! reports failures, so nothing unwinds into the caller.

pub mod abi;
pub mod device;
pub mod rules;

use abi::*;
use device::{lock, Cq, Dev, Job, MrInfo, Qp, QpState, Recv};
use rules::Rules;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

fn set_errno(e: c_int) {
    // SAFETY: the thread's errno.
    #[cfg(target_os = "linux")]
    unsafe {
        *libc::__errno_location() = e
    };
    #[cfg(not(target_os = "linux"))]
    unsafe {
        *libc::__error() = e
    };
}

/// Runs `f`, turning a panic into `fail` (and one line on stderr) instead of unwinding into C.
fn guard<T>(fail: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("softrdma: internal error (a bug in the software device)");
            set_errno(libc::EIO);
            fail
        }
    }
}

/// Returns a null pointer with errno set, as the C API fails.
fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// What one listed device is: its rules, and the address it listens on where it stands for
/// one interface's cable.
pub struct DevSpec {
    pub name: String,
    pub rules: &'static Rules,
    pub bound: Option<std::net::Ipv4Addr>,
}

struct DeviceList(Vec<IbvDevice>, Vec<DevSpec>);
// The device records are written once and only read after.
unsafe impl Send for DeviceList {}
unsafe impl Sync for DeviceList {}

/// The devices: the two rule sets' (`softrdma_apple0`, `softrdma_linux0`, listening on every
/// address or the run's), then one per interface that is up with an IPv4 address, named as
/// Apple names a Thunderbolt port's (`rdma_en3`), with Apple's rules, bound to that
/// interface's address: so a cluster cabled as Macs are, one device per cable, runs verbs
/// per cable in the lab. Listed once per process.
fn devices() -> &'static DeviceList {
    static LIST: OnceLock<DeviceList> = OnceLock::new();
    LIST.get_or_init(|| {
        let mut specs: Vec<DevSpec> = rules::ALL
            .iter()
            .map(|r| DevSpec {
                name: r.name.to_string(),
                rules: r,
                bound: None,
            })
            .collect();
        for (iface, ip) in device::interface_ipv4s() {
            let name = format!("rdma_{iface}");
            // A name as long as the C field holds; an interface listed twice, once.
            if name.len() < 64 && !specs.iter().any(|s| s.name == name) {
                specs.push(DevSpec {
                    name,
                    rules: &rules::APPLE,
                    bound: Some(ip),
                });
            }
        }
        let records = specs
            .iter()
            .map(|spec| {
                let mut d = IbvDevice {
                    ops: [std::ptr::null_mut(); 2],
                    node_type: 1,      // IBV_NODE_CA
                    transport_type: 0, // IBV_TRANSPORT_IB (RoCE reports this too)
                    name: [0; 64],
                    dev_name: [0; 64],
                    dev_path: [0; 256],
                    ibdev_path: [0; 256],
                };
                d.name[..spec.name.len()].copy_from_slice(spec.name.as_bytes());
                d.dev_name[..spec.name.len()].copy_from_slice(spec.name.as_bytes());
                d
            })
            .collect();
        DeviceList(records, specs)
    })
}

fn spec_of(dev: *mut IbvDevice) -> Option<&'static DevSpec> {
    let list = devices();
    list.0
        .iter()
        .position(|d| std::ptr::eq(d, dev))
        .map(|i| &list.1[i])
}

#[repr(C)]
struct SoftCtx {
    ibv: IbvContext,
    dev: Arc<Dev>,
}

#[repr(C)]
struct SoftPd {
    ibv: IbvPd,
    dev: Arc<Dev>,
    users: AtomicUsize,
}

#[repr(C)]
struct SoftMr {
    ibv: IbvMr,
    pd: *const SoftPd,
}

#[repr(C)]
struct SoftCq {
    ibv: IbvCq,
    cq: Arc<Cq>,
}

#[repr(C)]
struct SoftQp {
    ibv: IbvQp,
    qp: Arc<Qp>,
    pd: *const SoftPd,
}

/// # Safety
/// `ctx` must come from [`ibv_open_device`].
unsafe fn ctx_dev<'a>(ctx: *mut IbvContext) -> &'a Arc<Dev> {
    &(*(ctx as *mut SoftCtx)).dev
}

// --- devices ---------------------------------------------------------------------------------

/// # Safety
/// `num` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut IbvDevice {
    guard(std::ptr::null_mut(), || {
        let list = &devices().0;
        // calloc: freed by ibv_free_device_list without knowing the length.
        let arr = libc::calloc(list.len() + 1, std::mem::size_of::<*mut IbvDevice>())
            as *mut *mut IbvDevice;
        if arr.is_null() {
            return fail(libc::ENOMEM);
        }
        for (i, d) in list.iter().enumerate() {
            *arr.add(i) = d as *const IbvDevice as *mut IbvDevice;
        }
        if !num.is_null() {
            *num = list.len() as c_int;
        }
        arr
    })
}

/// # Safety
/// `list` comes from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut IbvDevice) {
    guard((), || libc::free(list as *mut c_void))
}

/// # Safety
/// `dev` comes from the device list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut IbvDevice) -> *const c_char {
    guard(std::ptr::null(), || {
        if spec_of(dev).is_none() {
            return std::ptr::null();
        }
        (*dev).name.as_ptr() as *const c_char
    })
}

/// # Safety
/// `dev` comes from the device list.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut IbvDevice) -> *mut IbvContext {
    guard(std::ptr::null_mut(), || {
        let Some(spec) = spec_of(dev) else {
            return fail(libc::ENODEV);
        };
        let d = match Dev::open(spec) {
            Ok(d) => d,
            Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        let mut ops = [std::ptr::null::<c_void>(); 32];
        ops[OP_POLL_CQ] = poll_cq as *const c_void;
        ops[OP_POST_SEND] = post_send as *const c_void;
        ops[OP_POST_RECV] = post_recv as *const c_void;
        let ctx = Box::new(SoftCtx {
            ibv: IbvContext {
                device: dev,
                ops,
                cmd_fd: -1,
                async_fd: -1,
                num_comp_vectors: 1,
                _rest: [0; 8],
            },
            dev: d,
        });
        Box::into_raw(ctx) as *mut IbvContext
    })
}

/// # Safety
/// `ctx` comes from [`ibv_open_device`] and is not used after.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut IbvContext) -> c_int {
    guard(libc::EIO, || {
        if ctx.is_null() {
            return libc::EINVAL;
        }
        let c = Box::from_raw(ctx as *mut SoftCtx);
        c.dev.close();
        0
    })
}

/// # Safety
/// `ctx` is open; `attr` is a writable `struct ibv_port_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
) -> c_int {
    guard(libc::EIO, || {
        if ctx.is_null() || attr.is_null() || port != 1 {
            return libc::EINVAL;
        }
        let d = ctx_dev(ctx);
        *attr = IbvPortAttr {
            state: IBV_PORT_ACTIVE,
            max_mtu: d.rules.mtu,
            active_mtu: d.rules.mtu,
            gid_tbl_len: d.gids.len() as c_int,
            port_cap_flags: 0,
            max_msg_sz: d.rules.max_msg.min(u32::MAX as u64) as u32,
            pkey_tbl_len: 1,
            // RoCE-style: addressed by GID, no LID.
            lid: 0,
            active_width: 1,
            active_speed: 1,
            phys_state: 5, // LinkUp
            link_layer: IBV_LINK_LAYER_ETHERNET,
            ..Default::default()
        };
        0
    })
}

/// # Safety
/// `ctx` is open; `gid` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    gid: *mut IbvGid,
) -> c_int {
    guard(-1, || {
        if ctx.is_null() || gid.is_null() || port != 1 {
            set_errno(libc::EINVAL);
            return -1;
        }
        let d = ctx_dev(ctx);
        match usize::try_from(index).ok().and_then(|i| d.gids.get(i)) {
            Some(g) => {
                *gid = IbvGid(*g);
                0
            }
            None => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

// --- protection domains and memory ----------------------------------------------------------

/// # Safety
/// `ctx` is open.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut IbvContext) -> *mut IbvPd {
    guard(std::ptr::null_mut(), || {
        if ctx.is_null() {
            return fail(libc::EINVAL);
        }
        let pd = Box::new(SoftPd {
            ibv: IbvPd {
                context: ctx,
                handle: 0,
            },
            dev: ctx_dev(ctx).clone(),
            users: AtomicUsize::new(0),
        });
        Box::into_raw(pd) as *mut IbvPd
    })
}

/// # Safety
/// `pd` comes from [`ibv_alloc_pd`].
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    guard(libc::EIO, || {
        if pd.is_null() {
            return libc::EINVAL;
        }
        let p = pd as *mut SoftPd;
        if (*p).users.load(Ordering::SeqCst) > 0 {
            return libc::EBUSY;
        }
        drop(Box::from_raw(p));
        0
    })
}

/// # Safety
/// `pd` is live; `addr..addr+len` is the caller's memory for the region's lifetime.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut IbvMr {
    guard(std::ptr::null_mut(), || {
        if pd.is_null() || (addr.is_null() && len > 0) {
            return fail(libc::EINVAL);
        }
        // verbs.h: remote write needs local write.
        if access & IBV_ACCESS_REMOTE_WRITE != 0 && access & IBV_ACCESS_LOCAL_WRITE == 0 {
            return fail(libc::EINVAL);
        }
        let p = &*(pd as *mut SoftPd);
        let d = &p.dev;
        let key = d.new_key();
        {
            let mut mrs = lock(&d.mrs);
            if mrs.len() >= d.rules.max_mrs {
                d.c.refused_mr_limit.fetch_add(1, Ordering::Relaxed);
                return fail(libc::ENOMEM);
            }
            mrs.insert(
                key,
                MrInfo {
                    addr: addr as u64,
                    len: len as u64,
                    access,
                },
            );
        }
        p.users.fetch_add(1, Ordering::SeqCst);
        let mr = Box::new(SoftMr {
            ibv: IbvMr {
                context: p.ibv.context,
                pd,
                addr,
                length: len,
                handle: key,
                lkey: key,
                rkey: key,
            },
            pd: p,
        });
        Box::into_raw(mr) as *mut IbvMr
    })
}

/// # Safety
/// `mr` comes from [`ibv_reg_mr`] and is not used after.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    guard(libc::EIO, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        let m = Box::from_raw(mr as *mut SoftMr);
        let p = &*m.pd;
        lock(&p.dev.mrs).remove(&m.ibv.lkey);
        p.users.fetch_sub(1, Ordering::SeqCst);
        0
    })
}

// --- completion queues ----------------------------------------------------------------------

/// # Safety
/// `ctx` is open.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut c_void,
    _comp_vector: c_int,
) -> *mut IbvCq {
    guard(std::ptr::null_mut(), || {
        if ctx.is_null() || !(1..=1 << 22).contains(&cqe) {
            return fail(libc::EINVAL);
        }
        let cq = Box::new(SoftCq {
            ibv: IbvCq {
                context: ctx,
                channel,
                cq_context,
                handle: 0,
                cqe,
                _mutex_cond: [0; 14],
                comp_events_completed: 0,
                async_events_completed: 0,
            },
            cq: Arc::new(Cq {
                q: Mutex::new(VecDeque::new()),
                cqe: cqe as usize,
                users: AtomicUsize::new(0),
                dev: ctx_dev(ctx).clone(),
            }),
        });
        Box::into_raw(cq) as *mut IbvCq
    })
}

/// # Safety
/// `cq` comes from [`ibv_create_cq`].
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    guard(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        let c: &SoftCq = &*(cq as *mut SoftCq);
        if c.cq.users.load(Ordering::SeqCst) > 0 {
            return libc::EBUSY;
        }
        drop(Box::from_raw(cq as *mut SoftCq));
        0
    })
}

/// The inline `ibv_poll_cq`'s target (ops entry 11).
unsafe extern "C" fn poll_cq(cq: *mut IbvCq, n: c_int, wc: *mut IbvWc) -> c_int {
    guard(-libc::EIO, || {
        if cq.is_null() || (wc.is_null() && n > 0) {
            return -libc::EINVAL;
        }
        let c = &(*(cq as *mut SoftCq)).cq;
        let mut q = lock(&c.q);
        let mut got = 0;
        while got < n.max(0) {
            let Some(x) = q.pop_front() else { break };
            *wc.add(got as usize) = x;
            got += 1;
        }
        got
    })
}

// --- queue pairs ----------------------------------------------------------------------------

/// # Safety
/// `pd` is live; `init` a valid `struct ibv_qp_init_attr`, whose `cap` is set to what was
/// granted.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut IbvPd, init: *mut IbvQpInitAttr) -> *mut IbvQp {
    guard(std::ptr::null_mut(), || {
        if pd.is_null() || init.is_null() {
            return fail(libc::EINVAL);
        }
        let p = &*(pd as *mut SoftPd);
        let d = &p.dev;
        let a = &mut *init;
        if a.qp_type == IBV_QPT_RC && !d.rules.allow_rc {
            d.c.refused_rc_qp.fetch_add(1, Ordering::Relaxed);
            return fail(d.rules.rc_errno);
        }
        if a.qp_type != IBV_QPT_RC && a.qp_type != IBV_QPT_UC {
            return fail(libc::EINVAL);
        }
        if a.send_cq.is_null() || a.recv_cq.is_null() || !a.srq.is_null() {
            return fail(libc::EINVAL);
        }
        if a.cap.max_send_sge > d.rules.max_sge || a.cap.max_recv_sge > d.rules.max_sge {
            return fail(libc::EINVAL);
        }
        let cap = IbvQpCap {
            max_send_wr: a.cap.max_send_wr.clamp(1, d.rules.max_wr),
            max_recv_wr: a.cap.max_recv_wr.clamp(1, d.rules.max_wr),
            max_send_sge: a.cap.max_send_sge.max(1),
            max_recv_sge: a.cap.max_recv_sge.max(1),
            max_inline_data: 0,
        };
        let send_cq = (*(a.send_cq as *mut SoftCq)).cq.clone();
        let recv_cq = (*(a.recv_cq as *mut SoftCq)).cq.clone();
        let qp = {
            let mut qps = lock(&d.qps);
            if qps.len() >= d.rules.max_qps {
                d.c.refused_qp_limit.fetch_add(1, Ordering::Relaxed);
                return fail(libc::ENOMEM);
            }
            // The number: the device's port, then a free 8-bit index (see `device`).
            let Some(qpn) = (1..=255u32)
                .map(|i| ((d.port as u32) << 8) | i)
                .find(|n| !qps.contains_key(n))
            else {
                d.c.refused_qp_limit.fetch_add(1, Ordering::Relaxed);
                return fail(libc::ENOMEM);
            };
            let qp = Arc::new(Qp {
                dev: d.clone(),
                qpn,
                qp_type: a.qp_type,
                send_cq,
                recv_cq,
                sig_all: a.sq_sig_all != 0,
                cap,
                st: Mutex::new(QpState {
                    attr: IbvQpAttr::default(),
                    recvs: VecDeque::new(),
                    send_out: 0,
                    recv_out: 0,
                }),
                cv: Condvar::new(),
                destroyed: AtomicBool::new(false),
                io_rx: Mutex::new(()),
                io_tx: Mutex::new(()),
                sender: Mutex::new(None),
            });
            qps.insert(qpn, qp.clone());
            qp
        };
        qp.send_cq.users.fetch_add(1, Ordering::SeqCst);
        qp.recv_cq.users.fetch_add(1, Ordering::SeqCst);
        p.users.fetch_add(1, Ordering::SeqCst);
        a.cap = cap;
        let soft = Box::new(SoftQp {
            ibv: IbvQp {
                context: p.ibv.context,
                qp_context: a.qp_context,
                pd,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: std::ptr::null_mut(),
                handle: qp.qpn,
                qp_num: qp.qpn,
                state: IBV_QPS_RESET,
                qp_type: a.qp_type,
                _mutex_cond: [0; 14],
                events_completed: 0,
            },
            qp,
            pd: p,
        });
        Box::into_raw(soft) as *mut IbvQp
    })
}

/// # Safety
/// `qp` comes from [`ibv_create_qp`] and is not used after.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        let s = Box::from_raw(qp as *mut SoftQp);
        let q = &s.qp;
        lock(&q.dev.qps).remove(&q.qpn);
        q.shut();
        q.send_cq.users.fetch_sub(1, Ordering::SeqCst);
        q.recv_cq.users.fetch_sub(1, Ordering::SeqCst);
        (*s.pd).users.fetch_sub(1, Ordering::SeqCst);
        0
    })
}

/// Which attributes a transition needs and which it may carry, as the kernel's
/// `ib_modify_qp_is_ok` table has them for RC and UC.
fn transition_masks(rc: bool, cur: u32, new: u32) -> Option<(c_int, c_int)> {
    let rc_only = |m: c_int| if rc { m } else { 0 };
    Some(match (cur, new) {
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => (IBV_QP_STATE, 0),
        (IBV_QPS_RESET, IBV_QPS_INIT) => (
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            0,
        ),
        (IBV_QPS_INIT, IBV_QPS_INIT) => (
            IBV_QP_STATE,
            IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        ),
        (IBV_QPS_INIT, IBV_QPS_RTR) => (
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | rc_only(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
        ),
        (IBV_QPS_RTR, IBV_QPS_RTS) => (
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | rc_only(
                    IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
                ),
            IBV_QP_CUR_STATE
                | IBV_QP_ALT_PATH
                | IBV_QP_ACCESS_FLAGS
                | IBV_QP_PATH_MIG_STATE
                | rc_only(IBV_QP_MIN_RNR_TIMER),
        ),
        (IBV_QPS_RTS, IBV_QPS_RTS) => (
            IBV_QP_STATE,
            IBV_QP_CUR_STATE
                | IBV_QP_ACCESS_FLAGS
                | IBV_QP_ALT_PATH
                | IBV_QP_PATH_MIG_STATE
                | rc_only(IBV_QP_MIN_RNR_TIMER),
        ),
        _ => return None,
    })
}

/// # Safety
/// `qp` is live; `attr` a valid `struct ibv_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, mask: c_int) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        let s = &mut *(qp as *mut SoftQp);
        let q = s.qp.clone();
        let d = &q.dev;
        let a = &*attr;
        let refuse = || {
            d.c.refused_modify.fetch_add(1, Ordering::Relaxed);
            libc::EINVAL
        };
        let mut st = lock(&q.st);
        let cur = st.attr.qp_state;
        let new = if mask & IBV_QP_STATE != 0 {
            a.qp_state
        } else {
            cur
        };
        if mask & IBV_QP_CUR_STATE != 0 && a.cur_qp_state != cur {
            return refuse();
        }
        let Some((need, may)) = transition_masks(q.qp_type == IBV_QPT_RC, cur, new) else {
            return refuse();
        };
        if mask & need != need || mask & !(need | may) != 0 {
            return refuse();
        }
        if mask & IBV_QP_PORT != 0 && a.port_num != 1 {
            return refuse();
        }
        if mask & IBV_QP_PATH_MTU != 0 && !(1..=d.rules.mtu).contains(&a.path_mtu) {
            return refuse();
        }
        if mask & IBV_QP_AV != 0 {
            // Both rule sets address peers by GID (RoCE and Apple's Thunderbolt alike), and
            // this device reaches them at their IPv4-mapped GID.
            let g = a.ah_attr.grh.dgid.0;
            let mapped = g[..10].iter().all(|b| *b == 0) && g[10] == 0xff && g[11] == 0xff;
            if a.ah_attr.is_global == 0
                || !mapped
                || a.ah_attr.grh.sgid_index as usize >= d.gids.len()
            {
                return refuse();
            }
        }
        if mask & IBV_QP_DEST_QPN != 0 && a.dest_qp_num > 0x00ff_ffff {
            return refuse();
        }
        if mask & IBV_QP_ACCESS_FLAGS != 0
            && !d.rules.allow_write
            && a.qp_access_flags as c_int & IBV_ACCESS_REMOTE_WRITE != 0
        {
            return refuse();
        }
        let keep = st.attr;
        let mut n = keep;
        n.qp_state = new;
        if mask & IBV_QP_ACCESS_FLAGS != 0 {
            n.qp_access_flags = a.qp_access_flags;
        }
        if mask & IBV_QP_PKEY_INDEX != 0 {
            n.pkey_index = a.pkey_index;
        }
        if mask & IBV_QP_PORT != 0 {
            n.port_num = a.port_num;
        }
        if mask & IBV_QP_AV != 0 {
            n.ah_attr = a.ah_attr;
        }
        if mask & IBV_QP_PATH_MTU != 0 {
            n.path_mtu = a.path_mtu;
        }
        if mask & IBV_QP_DEST_QPN != 0 {
            n.dest_qp_num = a.dest_qp_num;
        }
        if mask & IBV_QP_RQ_PSN != 0 {
            n.rq_psn = a.rq_psn;
        }
        if mask & IBV_QP_SQ_PSN != 0 {
            n.sq_psn = a.sq_psn;
        }
        if mask & IBV_QP_TIMEOUT != 0 {
            n.timeout = a.timeout;
        }
        if mask & IBV_QP_RETRY_CNT != 0 {
            n.retry_cnt = a.retry_cnt;
        }
        if mask & IBV_QP_RNR_RETRY != 0 {
            n.rnr_retry = a.rnr_retry;
        }
        if mask & IBV_QP_MIN_RNR_TIMER != 0 {
            n.min_rnr_timer = a.min_rnr_timer;
        }
        if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
            n.max_rd_atomic = a.max_rd_atomic;
        }
        if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
            n.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        st.attr = n;
        match new {
            IBV_QPS_RESET => {
                st.recvs.clear();
                st.recv_out = 0;
            }
            IBV_QPS_ERR => {
                // Posted receives are flushed with an error, as hardware does.
                let flushed: Vec<Recv> = st.recvs.drain(..).collect();
                st.recv_out = 0;
                drop(st);
                for r in flushed {
                    q.recv_cq.push(IbvWc {
                        wr_id: r.wr_id,
                        status: IBV_WC_WR_FLUSH_ERR,
                        opcode: IBV_WC_RECV,
                        qp_num: q.qpn,
                        ..Default::default()
                    });
                }
                st = lock(&q.st);
            }
            _ => {}
        }
        drop(st);
        if new == IBV_QPS_RTS {
            if let Err(e) = q.start_sender() {
                lock(&q.st).attr = keep;
                return e.raw_os_error().unwrap_or(libc::EAGAIN);
            }
        }
        s.ibv.state = new;
        q.cv.notify_all();
        0
    })
}

/// # Safety
/// `qp` is live; `attr` and `init` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    _mask: c_int,
    init: *mut IbvQpInitAttr,
) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        let s = &*(qp as *mut SoftQp);
        let q = &s.qp;
        let mut a = lock(&q.st).attr;
        a.cur_qp_state = a.qp_state;
        a.cap = q.cap;
        *attr = a;
        if !init.is_null() {
            *init = IbvQpInitAttr {
                qp_context: s.ibv.qp_context,
                send_cq: s.ibv.send_cq,
                recv_cq: s.ibv.recv_cq,
                srq: std::ptr::null_mut(),
                cap: q.cap,
                qp_type: q.qp_type,
                sq_sig_all: q.sig_all as c_int,
            };
        }
        0
    })
}

/// Checks a gather/scatter list against this device's regions: the entries, their total,
/// or None when one names memory not registered with `access`.
unsafe fn sg_list(
    d: &Dev,
    sg: *mut IbvSge,
    n: c_int,
    access: c_int,
) -> Option<(Vec<(u64, u32)>, u64)> {
    let mut v = Vec::with_capacity(n.max(0) as usize);
    let mut total = 0u64;
    for i in 0..n.max(0) as usize {
        let e = &*sg.add(i);
        if e.length > 0 && !d.mr_covers(e.lkey, e.addr, e.length as u64, access) {
            return None;
        }
        v.push((e.addr, e.length));
        total += e.length as u64;
    }
    Some((v, total))
}

unsafe fn post_one_send(q: &Arc<Qp>, w: &IbvSendWr) -> c_int {
    let d = &q.dev;
    let state = lock(&q.st).attr.qp_state;
    if state != IBV_QPS_RTS && state != IBV_QPS_ERR {
        d.c.refused_bad_state.fetch_add(1, Ordering::Relaxed);
        return libc::EINVAL;
    }
    let kind = match w.opcode {
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM => device::WIRE_SEND,
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
            if !d.rules.allow_write {
                d.c.refused_write.fetch_add(1, Ordering::Relaxed);
                return d.rules.rc_errno;
            }
            if w.opcode == IBV_WR_RDMA_WRITE {
                device::WIRE_WRITE
            } else {
                device::WIRE_WRITE_IMM
            }
        }
        _ => return libc::EINVAL,
    };
    if w.num_sge < 0
        || w.num_sge as u32 > q.cap.max_send_sge
        || (w.num_sge > 0 && w.sg_list.is_null())
    {
        return libc::EINVAL;
    }
    // Local memory is not readable: the request completes with a protection error.
    let (sges, len, error) = match sg_list(d, w.sg_list, w.num_sge, 0) {
        Some((s, t)) => (s, t, None),
        None => {
            d.c.refused_bad_lkey.fetch_add(1, Ordering::Relaxed);
            (Vec::new(), 0, Some(IBV_WC_LOC_PROT_ERR))
        }
    };
    let cost = d.rules.cost(len);
    // A message larger than the whole granted depth can never be posted (Apple's rules
    // count frames): ENOMEM, as a full queue gives.
    if cost > q.cap.max_send_wr {
        d.c.refused_over_depth.fetch_add(1, Ordering::Relaxed);
        return libc::ENOMEM;
    }
    if len > d.rules.max_msg {
        d.c.refused_over_depth.fetch_add(1, Ordering::Relaxed);
        return libc::EINVAL;
    }
    {
        let mut st = lock(&q.st);
        if st.send_out + cost > q.cap.max_send_wr {
            d.c.refused_over_depth.fetch_add(1, Ordering::Relaxed);
            return libc::ENOMEM;
        }
        st.send_out += cost;
    }
    let job = Job {
        wr_id: w.wr_id,
        signaled: w.send_flags & IBV_SEND_SIGNALED != 0,
        kind,
        sges,
        len,
        imm: w.imm_data,
        remote_addr: w.remote_addr,
        rkey: w.rkey,
        cost,
        error,
    };
    let sent = lock(&q.sender).as_ref().map(|(tx, _)| tx.send(job).is_ok());
    if sent != Some(true) {
        let mut st = lock(&q.st);
        st.send_out = st.send_out.saturating_sub(cost);
        d.c.refused_bad_state.fetch_add(1, Ordering::Relaxed);
        return libc::EINVAL;
    }
    if kind == device::WIRE_SEND {
        d.c.sends_posted.fetch_add(1, Ordering::Relaxed);
    } else {
        d.c.writes_posted.fetch_add(1, Ordering::Relaxed);
    }
    0
}

/// The inline `ibv_post_send`'s target (ops entry 25).
unsafe extern "C" fn post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        let q = &(*(qp as *mut SoftQp)).qp;
        let mut cur = wr;
        while !cur.is_null() {
            let rc = post_one_send(q, &*cur);
            if rc != 0 {
                if !bad.is_null() {
                    *bad = cur;
                }
                return rc;
            }
            cur = (*cur).next;
        }
        0
    })
}

unsafe fn post_one_recv(q: &Arc<Qp>, w: &IbvRecvWr) -> c_int {
    let d = &q.dev;
    if w.num_sge < 0
        || w.num_sge as u32 > q.cap.max_recv_sge
        || (w.num_sge > 0 && w.sg_list.is_null())
    {
        return libc::EINVAL;
    }
    let Some((sges, total)) = sg_list(d, w.sg_list, w.num_sge, IBV_ACCESS_LOCAL_WRITE) else {
        d.c.refused_bad_lkey.fetch_add(1, Ordering::Relaxed);
        return libc::EINVAL;
    };
    let cost = d.rules.cost(total);
    let mut st = lock(&q.st);
    match st.attr.qp_state {
        IBV_QPS_RESET => {
            d.c.refused_bad_state.fetch_add(1, Ordering::Relaxed);
            return libc::EINVAL;
        }
        IBV_QPS_ERR => {
            drop(st);
            q.recv_cq.push(IbvWc {
                wr_id: w.wr_id,
                status: IBV_WC_WR_FLUSH_ERR,
                opcode: IBV_WC_RECV,
                qp_num: q.qpn,
                ..Default::default()
            });
            return 0;
        }
        IBV_QPS_RTS => {}
        _ if d.rules.recv_before_rts_lost => {
            // Accepted and lost, without an error: what Apple's stack does with receives
            // posted before RTS.
            d.c.recvs_lost_before_rts.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        _ => {}
    }
    if st.recv_out + cost > q.cap.max_recv_wr {
        d.c.refused_over_depth.fetch_add(1, Ordering::Relaxed);
        return libc::ENOMEM;
    }
    st.recv_out += cost;
    st.recvs.push_back(Recv {
        wr_id: w.wr_id,
        sges,
        total,
        cost,
    });
    drop(st);
    d.c.recvs_posted.fetch_add(1, Ordering::Relaxed);
    q.cv.notify_all();
    0
}

/// The inline `ibv_post_recv`'s target (ops entry 26).
unsafe extern "C" fn post_recv(
    qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        let q = &(*(qp as *mut SoftQp)).qp;
        let mut cur = wr;
        while !cur.is_null() {
            let rc = post_one_recv(q, &*cur);
            if rc != 0 {
                if !bad.is_null() {
                    *bad = cur;
                }
                return rc;
            }
            cur = (*cur).next;
        }
        0
    })
}

/// # Safety
/// Any value.
#[no_mangle]
pub unsafe extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    const NAMES: [&str; 23] = [
        "success\0",
        "local length error\0",
        "local QP operation error\0",
        "local EE context operation error\0",
        "local protection error\0",
        "Work Request Flushed Error\0",
        "memory management operation error\0",
        "bad response error\0",
        "local access error\0",
        "remote invalid request error\0",
        "remote access error\0",
        "remote operation error\0",
        "transport retry counter exceeded\0",
        "RNR retry counter exceeded\0",
        "local RDD violation error\0",
        "remote invalid RD request\0",
        "aborted error\0",
        "invalid EE context number\0",
        "invalid EE context state\0",
        "fatal error\0",
        "response timeout error\0",
        "general error\0",
        "TM error\0",
    ];
    NAMES.get(status as usize).unwrap_or(&"unknown\0").as_ptr() as *const c_char
}

// --- what only this library exports ---------------------------------------------------------

/// Present only in this library: tbbench looks it up to know the device is a software
/// stand-in, whose figures are never RDMA measurements.
#[no_mangle]
pub extern "C" fn softrdma_version() -> *const c_char {
    c"tbbench-softrdma 1".as_ptr()
}

/// Joins a run: devices opened after this listen on `ipv4` alone (an address in host byte
/// order; 0 for every address) and hold `secret` (`len` bytes, at most 16; shorter is padded
/// with zeros), which every connection between two devices must carry in its hello. tbbench
/// calls it with its session token and the rank's data address before it opens a device, so
/// a process outside the run can neither reach another network's listener nor be heard.
/// Returns 0, or -1 with errno EINVAL for a longer secret.
///
/// # Safety
/// `secret` has `len` readable bytes (or is null with `len` 0).
#[no_mangle]
pub unsafe extern "C" fn softrdma_join_run(secret: *const u8, len: usize, ipv4: u32) -> c_int {
    guard(-1, || {
        if len > device::SECRET_LEN || (secret.is_null() && len > 0) {
            set_errno(libc::EINVAL);
            return -1;
        }
        let mut s = [0u8; device::SECRET_LEN];
        if len > 0 {
            // SAFETY: the caller gives `len` readable bytes.
            s[..len].copy_from_slice(unsafe { std::slice::from_raw_parts(secret, len) });
        }
        device::join_run(device::Run {
            secret: s,
            addr: (ipv4 != 0).then(|| std::net::Ipv4Addr::from(ipv4)),
        });
        0
    })
}

/// The device's counters as one JSON object, written into `buf` (NUL-terminated, cut at
/// `len`). Returns the length the whole text needs, or -1.
///
/// # Safety
/// `ctx` is open; `buf` has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn softrdma_counters_json(
    ctx: *mut IbvContext,
    buf: *mut c_char,
    len: usize,
) -> isize {
    guard(-1, || {
        if ctx.is_null() {
            return -1;
        }
        let text = ctx_dev(ctx).stats_json();
        if !buf.is_null() && len > 0 {
            let n = text.len().min(len - 1);
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
        text.len() as isize
    })
}

/// Which devices this library lists, with what each stands for (for `tbbench env` and docs).
pub fn device_names() -> HashMap<&'static str, &'static str> {
    rules::ALL.iter().map(|r| (r.name, r.stands_for)).collect()
}
