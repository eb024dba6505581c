//! The small collectives every suite and the driver lean on (barrier, broadcast, gather, an
//! all-reduce of a few values) on a partial cabling: a ring's diagonals have no cable, and over
//! RDMA no path at all, so these go along a spanning tree of the cables instead of the
//! rank-numbered trees and rounds they use where every pair is linked. The tree is a
//! breadth-first one from the root, neighbours taken in rank order, so every rank derives the
//! same one and a reduction combines in the same order on every run.

use super::{as_bytes, as_bytes_mut, Comm, Element};
use crate::transport::{RecvOp, SendOp};
use anyhow::{bail, Result};

/// A rank's place in the cables' spanning tree from some root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    pub parent: Option<usize>,
    pub children: Vec<usize>,
}

/// Where `me` sits in the breadth-first tree of the cables from `root`, on `size` ranks with
/// no cable between the `unlinked` pairs (lower rank first). A rank no chain of cables reaches
/// is named in the error.
pub(crate) fn place(size: usize, unlinked: &[[usize; 2]], root: usize, me: usize) -> Result<Place> {
    let linked = |a: usize, b: usize| a != b && !unlinked.contains(&[a.min(b), a.max(b)]);
    let mut parent: Vec<Option<usize>> = vec![None; size];
    let mut seen = vec![false; size];
    seen[root] = true;
    let mut queue = std::collections::VecDeque::from([root]);
    while let Some(u) = queue.pop_front() {
        for v in 0..size {
            if !seen[v] && linked(u, v) {
                seen[v] = true;
                parent[v] = Some(u);
                queue.push_back(v);
            }
        }
    }
    let cut_off: Vec<String> = (0..size)
        .filter(|&r| !seen[r])
        .map(|r| r.to_string())
        .collect();
    if !cut_off.is_empty() {
        bail!(
            "no chain of cables joins rank(s) {} to rank {root} (network.topology.unlinked)",
            cut_off.join(", ")
        );
    }
    Ok(Place {
        parent: parent[me],
        children: (0..size).filter(|&c| parent[c] == Some(me)).collect(),
    })
}

impl Comm {
    /// Whether the small collectives must keep to the cables' tree.
    pub(crate) fn on_cable_tree(&self) -> bool {
        !self.unlinked.is_empty()
    }

    fn tree_place(&self, root: usize) -> Result<Place> {
        place(self.size(), &self.unlinked, root, self.rank())
    }

    /// Every rank's word reaches rank 0 up the tree, then rank 0's back down.
    pub(crate) fn tree_barrier(&mut self) -> Result<()> {
        let p = self.tree_place(0)?;
        let mut words = vec![[0u8; 1]; p.children.len()];
        self.tree_up(&p, &mut words)?;
        let mut word = [1u8];
        self.tree_bcast(0, &mut word)
    }

    /// Receives one message of the given sizes from each child at once, then sends `up` (if
    /// this rank has a parent).
    fn tree_up(&mut self, p: &Place, from_children: &mut [[u8; 1]]) -> Result<()> {
        let mut recvs: Vec<RecvOp> = p
            .children
            .iter()
            .zip(from_children.iter_mut())
            .map(|(&peer, b)| RecvOp { peer, buf: b })
            .collect();
        self.t.exchange(&[], &mut recvs)?;
        if let Some(parent) = p.parent {
            self.t.send(parent, &[1])?;
        }
        Ok(())
    }

    /// `buf` from `root` down the tree: from the parent, then to every child at once.
    pub(crate) fn tree_bcast(&mut self, root: usize, buf: &mut [u8]) -> Result<()> {
        let p = self.tree_place(root)?;
        if let Some(parent) = p.parent {
            self.t.recv(parent, buf)?;
        }
        let sends: Vec<SendOp> = p
            .children
            .iter()
            .map(|&peer| SendOp { peer, buf })
            .collect();
        self.t.exchange(&sends, &mut [])
    }

    /// Each rank's bytes at `root`, in rank order: every rank sends its parent its own and
    /// its subtree's, each entry as (rank, length, bytes), the whole preceded by its length.
    pub(crate) fn tree_gather(&mut self, root: usize, mine: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        let p = self.tree_place(root)?;
        let size = self.size();
        let mut entries: Vec<(usize, Vec<u8>)> = vec![(self.rank(), mine.to_vec())];
        for &child in &p.children {
            let mut len = [0u8; 8];
            self.t.recv(child, &mut len)?;
            let len = usize::try_from(u64::from_le_bytes(len))?;
            let mut blob = vec![0u8; len];
            self.t.recv(child, &mut blob)?;
            entries.extend(decode_entries(&blob, size)?);
        }
        match p.parent {
            Some(parent) => {
                let mut blob = Vec::new();
                for (r, bytes) in &entries {
                    blob.extend_from_slice(&(*r as u64).to_le_bytes());
                    blob.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                    blob.extend_from_slice(bytes);
                }
                self.t.send(parent, &(blob.len() as u64).to_le_bytes())?;
                self.t.send(parent, &blob)?;
                Ok(None)
            }
            None => {
                let mut all: Vec<Option<Vec<u8>>> = vec![None; size];
                for (r, bytes) in entries {
                    all[r] = Some(bytes);
                }
                Ok(Some(
                    all.into_iter().map(Option::unwrap_or_default).collect(),
                ))
            }
        }
    }

    /// All-reduce along the tree: children's vectors combined in at each rank in child order
    /// up to rank 0, the result broadcast back down, so every rank holds the same bits.
    pub(crate) fn tree_reduce_all<T: Element>(
        &mut self,
        data: &mut [T],
        combine: impl Fn(&mut [T], &[T]),
    ) -> Result<()> {
        let p = self.tree_place(0)?;
        let mut theirs: Vec<T> = data.to_vec();
        for &child in &p.children {
            self.t.recv(child, as_bytes_mut(&mut theirs))?;
            combine(data, &theirs);
        }
        if let Some(parent) = p.parent {
            self.t.send(parent, as_bytes(data))?;
        }
        self.tree_bcast(0, as_bytes_mut(data))
    }
}

/// The (rank, bytes) entries of a subtree's gather message, each rank in range and once.
fn decode_entries(blob: &[u8], size: usize) -> Result<Vec<(usize, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < blob.len() {
        if blob.len() - at < 16 {
            bail!("a gather message cut short");
        }
        let r = u64::from_le_bytes(blob[at..at + 8].try_into().expect("8 bytes")) as usize;
        let len = u64::from_le_bytes(blob[at + 8..at + 16].try_into().expect("8 bytes"));
        at += 16;
        let len = usize::try_from(len)
            .ok()
            .filter(|l| *l <= blob.len() - at)
            .ok_or_else(|| anyhow::anyhow!("a gather message cut short"))?;
        if r >= size || out.iter().any(|(x, _)| *x == r) {
            bail!("a gather message names rank {r} wrongly");
        }
        out.push((r, blob[at..at + len].to_vec()));
        at += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_of_four_is_a_tree_over_its_cables() {
        let ring4 = [[0, 2], [1, 3]];
        let at = |me| place(4, &ring4, 0, me).unwrap();
        assert_eq!(at(0).children, vec![1, 3]);
        assert_eq!(at(1).parent, Some(0));
        assert_eq!(at(2).parent, Some(1), "2 has no cable to 0: through 1");
        assert_eq!(at(3).parent, Some(0));
        assert!(at(3).children.is_empty());
        // From rank 2 the tree turns round.
        assert_eq!(place(4, &ring4, 2, 0).unwrap().parent, Some(1));
    }

    #[test]
    fn a_rank_no_cable_reaches_is_named() {
        // Rank 2 is cabled to nobody.
        let e = place(3, &[[0, 2], [1, 2]], 0, 0).unwrap_err().to_string();
        assert!(e.contains("rank(s) 2") && e.contains("rank 0"), "{e}");
    }

    #[test]
    fn gather_entries_are_checked() {
        let mut blob = Vec::new();
        blob.extend_from_slice(&1u64.to_le_bytes());
        blob.extend_from_slice(&3u64.to_le_bytes());
        blob.extend_from_slice(b"abc");
        assert_eq!(
            decode_entries(&blob, 4).unwrap(),
            vec![(1, b"abc".to_vec())]
        );
        assert!(decode_entries(&blob[..18], 4).is_err(), "cut short");
        assert!(decode_entries(&blob, 1).is_err(), "rank out of range");
        let twice = [blob.clone(), blob].concat();
        assert!(decode_entries(&twice, 4).is_err(), "a rank twice");
    }
}
