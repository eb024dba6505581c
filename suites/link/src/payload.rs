//! Payload check: messages carry a pattern that depends on the size and the sending rank, and
//! the receiver compares what arrived (after the timed loop, never inside it), so a transport
//! that drops, reorders or corrupts bytes is caught and the result says so.

/// Fills `buf` with the pattern of (`size`, `sender`): a 64-bit LCG, so neighbouring bytes,
/// sizes and ranks all differ and a misplaced chunk cannot pass.
pub fn fill(buf: &mut [u8], size: u64, sender: usize) {
    let mut x = seed(size, sender);
    for chunk in buf.chunks_mut(8) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Counts bytes of `buf` that differ from the pattern (the `#wrong` column).
pub fn wrong_bytes(buf: &[u8], size: u64, sender: usize) -> u64 {
    let mut x = seed(size, sender);
    let mut wrong = 0;
    for chunk in buf.chunks(8) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let bytes = x.to_le_bytes();
        if chunk != &bytes[..chunk.len()] {
            wrong += chunk
                .iter()
                .zip(bytes.iter())
                .filter(|(a, b)| a != b)
                .count() as u64;
        }
    }
    wrong
}

fn seed(size: u64, sender: usize) -> u64 {
    size.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (sender as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trips_and_catches_changes() {
        let mut b = vec![0u8; 1001];
        fill(&mut b, 1001, 0);
        assert_eq!(wrong_bytes(&b, 1001, 0), 0);
        assert!(
            wrong_bytes(&b, 1001, 1) > 900,
            "another sender's pattern must differ"
        );
        b[500] ^= 1;
        assert_eq!(wrong_bytes(&b, 1001, 0), 1);
        let mut zero = vec![0u8; 64];
        assert_eq!(wrong_bytes(&zero, 64, 0), 64 - zero_hits(&zero));
        fill(&mut zero, 64, 0);
        assert_eq!(wrong_bytes(&zero, 64, 0), 0);
    }

    fn zero_hits(b: &[u8]) -> u64 {
        let mut p = vec![0u8; b.len()];
        fill(&mut p, b.len() as u64, 0);
        p.iter().filter(|x| **x == 0).count() as u64
    }
}
