//! The verbs transport's control messages: their kinds and sizes, and the work-request ids
//! that say which queue pair and what kind of work a completion is for.

/// Control messages fill at most one frame, so every control receive fits every message.
pub(super) const CTL_SLOT: usize = 4096;
pub(super) const CTL_SEND_SLOTS: usize = 16;
/// Control receives kept posted per peer (at most the granted depth).
pub(super) const CTL_RECV_SLOTS: u32 = 128;
pub(super) const MSG_READY: u32 = 1;
pub(super) const MSG_HELLO: u32 = 2;
/// A small message itself: `arg` its length, the body its number then its bytes.
pub(super) const MSG_EAGER: u32 = 3;
/// Returns eager credits only (they ride in every control message's header).
pub(super) const MSG_CREDIT: u32 = 4;
/// A greeting's argument: what the sender knows. Greetings saying 0 or 1 are answered, so a
/// lost one is made up for; 2 is never answered, so greetings do not bounce forever.
pub(super) const HELLO_UNSEEN: u32 = 0;
pub(super) const HELLO_SEEN: u32 = 1;
pub(super) const HELLO_DONE: u32 = 2;
/// Kind, argument, eager credits returned, reserved: four little-endian u32.
pub(super) const CTL_HDR: usize = 16;
pub(super) const READY_ENTRY: usize = 32;
pub(super) const READY_MAX: usize = (CTL_SLOT - CTL_HDR) / READY_ENTRY;
/// Control receives held back from data notices, so greetings always find one posted.
pub(super) const CTL_SPARE: u32 = 4;
/// Control receives held for credit-only messages: each returns at least half the credits, so
/// at most two are ever unread.
pub(super) const CREDIT_MSGS: u32 = 2;
/// The largest message sent eagerly: one control frame less its headers.
pub const EAGER_MAX: usize = CTL_SLOT - CTL_HDR - 8;

pub(super) const K_DATA_SEND: u64 = 0;
pub(super) const K_DATA_RECV: u64 = 1;
pub(super) const K_CTL_SEND: u64 = 2;
pub(super) const K_CTL_RECV: u64 = 3;

pub(super) fn wr_id(kind: u64, peer: usize, low: u64) -> u64 {
    (kind << 62) | ((peer as u64 & 0xffff) << 40) | (low & 0xff_ffff_ffff)
}

pub(super) fn split_wr_id(id: u64) -> (u64, usize, u64) {
    (
        id >> 62,
        ((id >> 40) & 0xffff) as usize,
        id & 0xff_ffff_ffff,
    )
}
