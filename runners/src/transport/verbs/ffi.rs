//! The slice of the verbs C API this transport uses: struct layouts, constants, and the
//! library's functions looked up at run time.
//!
//! Nothing links against libibverbs: the default build, its tests and hosts without RDMA must
//! not need it. The structs are declared only as far as the fields read or written here; every
//! field used sits before anything platform-dependent (pthread mutexes differ in size between
//! Linux and macOS), so one declaration serves both. A test compiles a C program against the
//! installed `verbs.h` and compares sizes and offsets.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

pub const IBV_QPS_RESET: u32 = 0;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UC: u32 = 3;

pub const IBV_MTU_256: u32 = 1;
pub const IBV_MTU_1024: u32 = 3;
pub const IBV_MTU_4096: u32 = 5;

pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_CAP: c_int = 1 << 19;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;

pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_WR_SEND: u32 = 2;

pub const IBV_SEND_SIGNALED: u32 = 1 << 1;

pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_WC_RECV: u32 = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: u32 = IBV_WC_RECV + 1;
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;

pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// A GID's 16 raw bytes, network order.
pub type Gid = [u8; 16];

/// `union ibv_gid` as C lays it out: its other member is two 64-bit words, which makes it
/// (and every struct holding it) 8-byte aligned.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvGid(pub Gid);

#[repr(C)]
pub struct IbvDevice {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
}

#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// Only `context` is read (the inline poll goes through it); the rest is the library's.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
}

/// Declared up to `qp_num`: the fields after it hold pthread types whose size differs by OS.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
}

pub type PollCqFn = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers. verbs.h's `ibv_post_send`, `ibv_post_recv`
/// and `ibv_poll_cq` are inline functions that call entries 25, 26 and 11; they are not
/// exported symbols, so this transport calls through the same entries.
#[repr(C)]
pub struct IbvContextOps {
    _before_poll_cq: [*mut c_void; 11],
    pub poll_cq: Option<PollCqFn>,
    _before_post_send: [*mut c_void; 13],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    _after: [*mut c_void; 5],
}

/// Declared up to `num_comp_vectors`; a mutex (OS-specific size) follows.
#[repr(C)]
pub struct IbvContext {
    pub device: *mut IbvDevice,
    pub ops: IbvContextOps,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_send_wr`, 128 bytes on LP64. Of its unions only `wr.rdma` is used; the others
/// are padding of the right size.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type: [u32; 2],
    _tail: [u64; 6],
}

impl IbvSendWr {
    pub fn zeroed() -> Self {
        IbvSendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            _wr_rest: [0; 5],
            _qp_type: [0; 2],
            _tail: [0; 6],
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// The library's exported functions this transport calls, resolved with dlsym.
pub struct Lib {
    handle: *mut c_void,
    /// What was loaded, for messages.
    pub path: String,
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice,
    pub free_device_list: unsafe extern "C" fn(*mut *mut IbvDevice),
    pub get_device_name: unsafe extern "C" fn(*mut IbvDevice) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut IbvDevice) -> *mut IbvContext,
    pub close_device: unsafe extern "C" fn(*mut IbvContext) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut IbvGid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd,
    pub dealloc_pd: unsafe extern "C" fn(*mut IbvPd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr,
    pub dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    pub create_cq:
        unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut c_void, c_int) -> *mut IbvCq,
    pub destroy_cq: unsafe extern "C" fn(*mut IbvCq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut IbvPd, *mut IbvQpInitAttr) -> *mut IbvQp,
    pub destroy_qp: unsafe extern "C" fn(*mut IbvQp) -> c_int,
    pub modify_qp: unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int,
    pub query_qp:
        unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int, *mut IbvQpInitAttr) -> c_int,
    pub wc_status_str: unsafe extern "C" fn(u32) -> *const c_char,
    /// What `softrdma_version` says, where the library exports it: the library is tbbench's
    /// software device (runners/softrdma), a stand-in whose figures are not RDMA's.
    pub emulated: Option<String>,
    /// `softrdma_join_run`, where the library exports it (the software device): gives it the
    /// run's secret and address, so no process outside the run can reach its queue pairs.
    pub join_run: Option<unsafe extern "C" fn(*const u8, usize, u32) -> c_int>,
}

// The handle and function pointers are process-wide and immutable once loaded.
unsafe impl Send for Lib {}
unsafe impl Sync for Lib {}

/// Where the verbs library lives on this OS.
pub fn default_library() -> &'static str {
    if cfg!(target_vendor = "apple") {
        "/usr/lib/librdma.dylib"
    } else {
        "libibverbs.so.1"
    }
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl Lib {
    /// Loads `path` and resolves every function; the error is one line naming the library and
    /// what is missing.
    // Each transmute's target is the struct field it initialises, spelled once there.
    #[allow(clippy::missing_transmute_annotations)]
    pub fn open(path: &str) -> Result<Lib, String> {
        let c = CString::new(path).map_err(|_| format!("bad library path {path:?}"))?;
        // SAFETY: dlopen with a valid C string; RTLD_NOW so a broken library fails here.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("cannot load {path}: {}", dlerror_text()));
        }
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let n = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: handle is a live dlopen handle.
            let p = unsafe { libc::dlsym(handle, n.as_ptr()) };
            if p.is_null() {
                Err(format!("{path} has no {name}: {}", dlerror_text()))
            } else {
                Ok(p)
            }
        };
        macro_rules! f {
            ($name:literal) => {
                // SAFETY: the symbol is the C function of that name, whose prototype in
                // verbs.h the field's type mirrors.
                unsafe { std::mem::transmute::<*mut c_void, _>(sym($name)?) }
            };
        }
        let lib = (|| -> Result<Lib, String> {
            Ok(Lib {
                handle,
                path: path.to_string(),
                get_device_list: f!("ibv_get_device_list"),
                free_device_list: f!("ibv_free_device_list"),
                get_device_name: f!("ibv_get_device_name"),
                open_device: f!("ibv_open_device"),
                close_device: f!("ibv_close_device"),
                query_port: f!("ibv_query_port"),
                query_gid: f!("ibv_query_gid"),
                alloc_pd: f!("ibv_alloc_pd"),
                dealloc_pd: f!("ibv_dealloc_pd"),
                reg_mr: f!("ibv_reg_mr"),
                dereg_mr: f!("ibv_dereg_mr"),
                create_cq: f!("ibv_create_cq"),
                destroy_cq: f!("ibv_destroy_cq"),
                create_qp: f!("ibv_create_qp"),
                destroy_qp: f!("ibv_destroy_qp"),
                modify_qp: f!("ibv_modify_qp"),
                query_qp: f!("ibv_query_qp"),
                wc_status_str: f!("ibv_wc_status_str"),
                // SAFETY: softrdma_join_run is `int (const uint8_t *, size_t, uint32_t)`.
                join_run: sym("softrdma_join_run")
                    .ok()
                    .map(|p| unsafe { std::mem::transmute(p) }),
                emulated: sym("softrdma_version").ok().map(|p| {
                    // SAFETY: softrdma_version is `const char *(void)` returning a static
                    // string.
                    unsafe {
                        let f: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(p);
                        CStr::from_ptr(f()).to_string_lossy().into_owned()
                    }
                }),
            })
        })();
        if lib.is_err() {
            // SAFETY: nothing from the handle is kept.
            unsafe { libc::dlclose(handle) };
        }
        lib
    }

    /// # Safety
    /// `dev` must come from this library's device list, not yet freed.
    pub unsafe fn device_name(&self, dev: *mut IbvDevice) -> String {
        unsafe {
            let p = (self.get_device_name)(dev);
            if p.is_null() {
                "?".into()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    pub fn status_str(&self, status: u32) -> String {
        // SAFETY: returns a static string for any value.
        unsafe {
            let p = (self.wc_status_str)(status);
            if p.is_null() {
                format!("status {status}")
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }
}

impl Drop for Lib {
    fn drop(&mut self) {
        // SAFETY: every object made through the library is gone before the Lib (the transport
        // and memory regions hold an Arc to it).
        unsafe { libc::dlclose(self.handle) };
    }
}

/// `ibv_post_send` as verbs.h defines it: through the QP's context's ops table.
///
/// # Safety
/// `qp` must be a live QP and `wr` a valid chain whose buffers stay registered and alive
/// until their completions are polled.
pub unsafe fn post_send(qp: *mut IbvQp, wr: *mut IbvSendWr) -> c_int {
    let mut bad: *mut IbvSendWr = std::ptr::null_mut();
    match (*(*qp).context).ops.post_send {
        Some(f) => f(qp, wr, &mut bad),
        None => libc::ENOSYS,
    }
}

/// `ibv_post_recv`, the same way.
///
/// # Safety
/// As [`post_send`].
pub unsafe fn post_recv(qp: *mut IbvQp, wr: *mut IbvRecvWr) -> c_int {
    let mut bad: *mut IbvRecvWr = std::ptr::null_mut();
    match (*(*qp).context).ops.post_recv {
        Some(f) => f(qp, wr, &mut bad),
        None => libc::ENOSYS,
    }
}

/// `ibv_poll_cq`, the same way: completions written to `wc`, their count returned (< 0 on
/// error).
///
/// # Safety
/// `cq` must be a live CQ.
pub unsafe fn poll_cq(cq: *mut IbvCq, wc: &mut [IbvWc]) -> c_int {
    match (*(*cq).context).ops.poll_cq {
        Some(f) => f(cq, wc.len() as c_int, wc.as_mut_ptr()),
        None => -libc::ENOSYS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn missing_library_gives_one_line_naming_it() {
        let e = match Lib::open("/nonexistent/libibverbs-tbbench-test.so.1") {
            Err(e) => e,
            Ok(_) => panic!("a nonexistent path must not load"),
        };
        assert!(
            e.starts_with("cannot load /nonexistent/libibverbs-tbbench-test.so.1"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn library_without_verbs_symbols_is_named() {
        // libc loads everywhere and has no verbs functions.
        let libc_path = if cfg!(target_vendor = "apple") {
            "/usr/lib/libSystem.B.dylib"
        } else {
            "libc.so.6"
        };
        let e = match Lib::open(libc_path) {
            Err(e) => e,
            Ok(_) => panic!("libc is not a verbs library"),
        };
        assert!(
            e.contains("has no ibv_get_device_list"),
            "the first missing symbol is named: {e}"
        );
    }

    /// Rust's view of each struct, as (name, value) lines the C program prints too.
    fn rust_layout() -> Vec<(String, usize)> {
        let ops = offset_of!(IbvContext, ops);
        let v: Vec<(&str, usize)> = vec![
            ("sizeof_ibv_sge", size_of::<IbvSge>()),
            ("sizeof_ibv_recv_wr", size_of::<IbvRecvWr>()),
            ("sizeof_ibv_send_wr", size_of::<IbvSendWr>()),
            ("send_wr_num_sge", offset_of!(IbvSendWr, num_sge)),
            ("send_wr_opcode", offset_of!(IbvSendWr, opcode)),
            ("send_wr_send_flags", offset_of!(IbvSendWr, send_flags)),
            ("send_wr_imm_data", offset_of!(IbvSendWr, imm_data)),
            ("send_wr_remote_addr", offset_of!(IbvSendWr, remote_addr)),
            ("send_wr_rkey", offset_of!(IbvSendWr, rkey)),
            ("sizeof_ibv_wc", size_of::<IbvWc>()),
            ("wc_status", offset_of!(IbvWc, status)),
            ("wc_opcode", offset_of!(IbvWc, opcode)),
            ("wc_byte_len", offset_of!(IbvWc, byte_len)),
            ("wc_imm_data", offset_of!(IbvWc, imm_data)),
            ("wc_qp_num", offset_of!(IbvWc, qp_num)),
            ("wc_wc_flags", offset_of!(IbvWc, wc_flags)),
            ("sizeof_ibv_qp_cap", size_of::<IbvQpCap>()),
            ("sizeof_ibv_qp_init_attr", size_of::<IbvQpInitAttr>()),
            ("init_attr_cap", offset_of!(IbvQpInitAttr, cap)),
            ("init_attr_qp_type", offset_of!(IbvQpInitAttr, qp_type)),
            (
                "init_attr_sq_sig_all",
                offset_of!(IbvQpInitAttr, sq_sig_all),
            ),
            ("sizeof_ibv_gid", size_of::<IbvGid>()),
            ("alignof_ibv_gid", std::mem::align_of::<IbvGid>()),
            ("sizeof_ibv_global_route", size_of::<IbvGlobalRoute>()),
            ("alignof_ibv_qp_attr", std::mem::align_of::<IbvQpAttr>()),
            ("alignof_ibv_send_wr", std::mem::align_of::<IbvSendWr>()),
            ("sizeof_ibv_ah_attr", size_of::<IbvAhAttr>()),
            ("ah_dlid", offset_of!(IbvAhAttr, dlid)),
            ("ah_is_global", offset_of!(IbvAhAttr, is_global)),
            ("ah_port_num", offset_of!(IbvAhAttr, port_num)),
            ("sizeof_ibv_qp_attr", size_of::<IbvQpAttr>()),
            ("qp_attr_path_mtu", offset_of!(IbvQpAttr, path_mtu)),
            ("qp_attr_rq_psn", offset_of!(IbvQpAttr, rq_psn)),
            ("qp_attr_sq_psn", offset_of!(IbvQpAttr, sq_psn)),
            ("qp_attr_dest_qp_num", offset_of!(IbvQpAttr, dest_qp_num)),
            ("qp_attr_access", offset_of!(IbvQpAttr, qp_access_flags)),
            ("qp_attr_cap", offset_of!(IbvQpAttr, cap)),
            ("qp_attr_ah_attr", offset_of!(IbvQpAttr, ah_attr)),
            ("qp_attr_pkey_index", offset_of!(IbvQpAttr, pkey_index)),
            (
                "qp_attr_max_rd_atomic",
                offset_of!(IbvQpAttr, max_rd_atomic),
            ),
            (
                "qp_attr_max_dest_rd_atomic",
                offset_of!(IbvQpAttr, max_dest_rd_atomic),
            ),
            (
                "qp_attr_min_rnr_timer",
                offset_of!(IbvQpAttr, min_rnr_timer),
            ),
            ("qp_attr_port_num", offset_of!(IbvQpAttr, port_num)),
            ("qp_attr_timeout", offset_of!(IbvQpAttr, timeout)),
            ("qp_attr_retry_cnt", offset_of!(IbvQpAttr, retry_cnt)),
            ("qp_attr_rnr_retry", offset_of!(IbvQpAttr, rnr_retry)),
            ("qp_attr_rate_limit", offset_of!(IbvQpAttr, rate_limit)),
            ("sizeof_ibv_port_attr", size_of::<IbvPortAttr>()),
            ("port_state", offset_of!(IbvPortAttr, state)),
            ("port_active_mtu", offset_of!(IbvPortAttr, active_mtu)),
            ("port_gid_tbl_len", offset_of!(IbvPortAttr, gid_tbl_len)),
            ("port_max_msg_sz", offset_of!(IbvPortAttr, max_msg_sz)),
            ("port_lid", offset_of!(IbvPortAttr, lid)),
            ("port_link_layer", offset_of!(IbvPortAttr, link_layer)),
            ("sizeof_ibv_mr", size_of::<IbvMr>()),
            ("mr_lkey", offset_of!(IbvMr, lkey)),
            ("mr_rkey", offset_of!(IbvMr, rkey)),
            ("qp_context", offset_of!(IbvQp, context)),
            ("qp_qp_num", offset_of!(IbvQp, qp_num)),
            ("cq_context", offset_of!(IbvCq, context)),
            ("ctx_ops", ops),
            ("ctx_poll_cq", ops + offset_of!(IbvContextOps, poll_cq)),
            ("ctx_post_send", ops + offset_of!(IbvContextOps, post_send)),
            ("ctx_post_recv", ops + offset_of!(IbvContextOps, post_recv)),
            ("sizeof_ibv_context_ops", size_of::<IbvContextOps>()),
            ("ctx_cmd_fd", offset_of!(IbvContext, cmd_fd)),
            (
                "ctx_num_comp_vectors",
                offset_of!(IbvContext, num_comp_vectors),
            ),
        ];
        v.into_iter().map(|(k, x)| (k.to_string(), x)).collect()
    }

    const LAYOUT_C: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#define S(n, t) printf("%s %zu\n", n, sizeof(t))
#define O(n, t, f) printf("%s %zu\n", n, offsetof(t, f))
int main(void) {
  S("sizeof_ibv_sge", struct ibv_sge);
  S("sizeof_ibv_recv_wr", struct ibv_recv_wr);
  S("sizeof_ibv_send_wr", struct ibv_send_wr);
  O("send_wr_num_sge", struct ibv_send_wr, num_sge);
  O("send_wr_opcode", struct ibv_send_wr, opcode);
  O("send_wr_send_flags", struct ibv_send_wr, send_flags);
  O("send_wr_imm_data", struct ibv_send_wr, imm_data);
  O("send_wr_remote_addr", struct ibv_send_wr, wr.rdma.remote_addr);
  O("send_wr_rkey", struct ibv_send_wr, wr.rdma.rkey);
  S("sizeof_ibv_wc", struct ibv_wc);
  O("wc_status", struct ibv_wc, status);
  O("wc_opcode", struct ibv_wc, opcode);
  O("wc_byte_len", struct ibv_wc, byte_len);
  O("wc_imm_data", struct ibv_wc, imm_data);
  O("wc_qp_num", struct ibv_wc, qp_num);
  O("wc_wc_flags", struct ibv_wc, wc_flags);
  S("sizeof_ibv_qp_cap", struct ibv_qp_cap);
  S("sizeof_ibv_qp_init_attr", struct ibv_qp_init_attr);
  O("init_attr_cap", struct ibv_qp_init_attr, cap);
  O("init_attr_qp_type", struct ibv_qp_init_attr, qp_type);
  O("init_attr_sq_sig_all", struct ibv_qp_init_attr, sq_sig_all);
  S("sizeof_ibv_gid", union ibv_gid);
  printf("alignof_ibv_gid %zu\n", _Alignof(union ibv_gid));
  S("sizeof_ibv_global_route", struct ibv_global_route);
  printf("alignof_ibv_qp_attr %zu\n", _Alignof(struct ibv_qp_attr));
  printf("alignof_ibv_send_wr %zu\n", _Alignof(struct ibv_send_wr));
  S("sizeof_ibv_ah_attr", struct ibv_ah_attr);
  O("ah_dlid", struct ibv_ah_attr, dlid);
  O("ah_is_global", struct ibv_ah_attr, is_global);
  O("ah_port_num", struct ibv_ah_attr, port_num);
  S("sizeof_ibv_qp_attr", struct ibv_qp_attr);
  O("qp_attr_path_mtu", struct ibv_qp_attr, path_mtu);
  O("qp_attr_rq_psn", struct ibv_qp_attr, rq_psn);
  O("qp_attr_sq_psn", struct ibv_qp_attr, sq_psn);
  O("qp_attr_dest_qp_num", struct ibv_qp_attr, dest_qp_num);
  O("qp_attr_access", struct ibv_qp_attr, qp_access_flags);
  O("qp_attr_cap", struct ibv_qp_attr, cap);
  O("qp_attr_ah_attr", struct ibv_qp_attr, ah_attr);
  O("qp_attr_pkey_index", struct ibv_qp_attr, pkey_index);
  O("qp_attr_max_rd_atomic", struct ibv_qp_attr, max_rd_atomic);
  O("qp_attr_max_dest_rd_atomic", struct ibv_qp_attr, max_dest_rd_atomic);
  O("qp_attr_min_rnr_timer", struct ibv_qp_attr, min_rnr_timer);
  O("qp_attr_port_num", struct ibv_qp_attr, port_num);
  O("qp_attr_timeout", struct ibv_qp_attr, timeout);
  O("qp_attr_retry_cnt", struct ibv_qp_attr, retry_cnt);
  O("qp_attr_rnr_retry", struct ibv_qp_attr, rnr_retry);
  O("qp_attr_rate_limit", struct ibv_qp_attr, rate_limit);
  S("sizeof_ibv_port_attr", struct ibv_port_attr);
  O("port_state", struct ibv_port_attr, state);
  O("port_active_mtu", struct ibv_port_attr, active_mtu);
  O("port_gid_tbl_len", struct ibv_port_attr, gid_tbl_len);
  O("port_max_msg_sz", struct ibv_port_attr, max_msg_sz);
  O("port_lid", struct ibv_port_attr, lid);
  O("port_link_layer", struct ibv_port_attr, link_layer);
  S("sizeof_ibv_mr", struct ibv_mr);
  O("mr_lkey", struct ibv_mr, lkey);
  O("mr_rkey", struct ibv_mr, rkey);
  O("qp_context", struct ibv_qp, context);
  O("qp_qp_num", struct ibv_qp, qp_num);
  O("cq_context", struct ibv_cq, context);
  O("ctx_ops", struct ibv_context, ops);
  O("ctx_poll_cq", struct ibv_context, ops.poll_cq);
  O("ctx_post_send", struct ibv_context, ops.post_send);
  O("ctx_post_recv", struct ibv_context, ops.post_recv);
  S("sizeof_ibv_context_ops", struct ibv_context_ops);
  O("ctx_cmd_fd", struct ibv_context, cmd_fd);
  O("ctx_num_comp_vectors", struct ibv_context, num_comp_vectors);
  return 0;
}
"#;

    #[test]
    fn struct_layouts_match_the_installed_verbs_h() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        if !header.exists() {
            println!(
                "skipped: {} is missing (Debian: apt-get install libibverbs-dev)",
                header.display()
            );
            return;
        }
        let dir = std::env::temp_dir().join(format!("tbbench-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, LAYOUT_C).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = match std::process::Command::new(&cc)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                println!("skipped: no C compiler ({cc}: {e})");
                return;
            }
        };
        assert!(
            built.status.success(),
            "the layout program must compile against verbs.h:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let c: std::collections::HashMap<String, usize> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect();
        let rust = rust_layout();
        assert_eq!(
            c.len(),
            rust.len(),
            "every field is printed once by the C side"
        );
        let wrong: Vec<String> = rust
            .iter()
            .filter(|(k, v)| c.get(k) != Some(v))
            .map(|(k, v)| format!("{k}: rust {v}, C {:?}", c.get(k)))
            .collect();
        assert!(wrong.is_empty(), "layouts differ from verbs.h: {wrong:#?}");
    }
}
