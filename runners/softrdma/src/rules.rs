//! The two rule sets the library's devices follow.

use crate::abi::*;

#[derive(Debug)]
pub struct Rules {
    pub name: &'static str,
    /// One line for humans: what the device stands in for.
    pub stands_for: &'static str,
    /// RC queue pairs may be created (Apple's stack refuses them).
    pub allow_rc: bool,
    /// The errno a refused RC queue pair gives: 102, as users of macOS 26.2 measured.
    pub rc_errno: i32,
    /// RDMA WRITE (with or without immediate) may be posted.
    pub allow_write: bool,
    /// The port's MTU (`IBV_MTU_*`), both max and active.
    pub mtu: u32,
    /// A SEND and the RECV it lands in must span the same number of 4 KiB frames, else the
    /// receive completes with an error.
    pub frame_rule: bool,
    /// Outstanding work counts 4 KiB frames, not requests: the depth bounds a message's size.
    pub depth_counts_frames: bool,
    /// Receives posted before the queue pair reaches RTS are lost (counted, no error).
    pub recv_before_rts_lost: bool,
    pub max_mrs: usize,
    pub max_qps: usize,
    /// The largest send and receive depth granted; more is clamped, as ibv_create_qp writes
    /// back what it granted.
    pub max_wr: u32,
    pub max_sge: u32,
    /// Largest message a work request may carry.
    pub max_msg: u64,
}

pub const FRAME: u64 = 4096;

pub static APPLE: Rules = Rules {
    name: "softrdma_apple0",
    stands_for: "Apple's Thunderbolt RDMA (macOS 26.2+ rules: UC only, SEND/RECV only, MTU 1024, 4 KiB frames, depth 32)",
    allow_rc: false,
    rc_errno: 102,
    allow_write: false,
    mtu: IBV_MTU_1024,
    frame_rule: true,
    depth_counts_frames: true,
    recv_before_rts_lost: true,
    max_mrs: 100,
    max_qps: 10,
    max_wr: 32,
    max_sge: 1,
    max_msg: 32 * FRAME,
};

pub static LINUX: Rules = Rules {
    name: "softrdma_linux0",
    stands_for: "a ConnectX-class RoCE NIC (RC and UC, RDMA WRITE with immediate, MTU 4096)",
    allow_rc: true,
    rc_errno: 0,
    allow_write: true,
    mtu: IBV_MTU_4096,
    frame_rule: false,
    depth_counts_frames: false,
    recv_before_rts_lost: false,
    max_mrs: 1 << 20,
    // The queue-pair number carries the device's port and an 8-bit index (see `device`).
    max_qps: 255,
    max_wr: 8192,
    max_sge: 4,
    max_msg: 1 << 31,
};

pub static ALL: [&Rules; 2] = [&APPLE, &LINUX];

impl Rules {
    /// What one work request of `len` bytes takes of a queue's depth.
    pub fn cost(&self, len: u64) -> u32 {
        if self.depth_counts_frames {
            len.div_ceil(FRAME).max(1) as u32
        } else {
            1
        }
    }
}

pub fn frames(len: u64) -> u64 {
    len.div_ceil(FRAME)
}
