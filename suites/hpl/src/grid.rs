//! The P × Q process grid and 2D block-cyclic index maths (ScaLAPACK's numroc, indxg2l,
//! indxl2g, indxg2p), with the matrix's first block on process (0, 0) as HPL places it.

use serde::Serialize;

/// HPL.dat's PMAP: how ranks are laid over the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessMap {
    /// Rank r sits at row r / Q, column r % Q.
    RowMajor,
    /// Rank r sits at row r % P, column r / P.
    ColumnMajor,
    /// Row-major with every other row reversed, so consecutive ranks are grid neighbours: a
    /// 2×2 grid on a ring of four cabled in rank order has every process row and column on a
    /// cable (tbbench's choice on a partial cabling; HPL.dat has no such PMAP).
    Snake,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grid {
    pub p: usize,
    pub q: usize,
    pub map: ProcessMap,
    /// The ranks in the order the map lays them (its seat s holds `order[s]`): the cables'
    /// order round a ring, where the hostfile lists the hosts another way round; None: rank
    /// order.
    #[serde(skip)]
    pub order: Option<Vec<usize>>,
}

impl Grid {
    /// The grid for `ranks` processes as HPL users pick it: as square as possible, P ≤ Q.
    pub fn squarest(ranks: usize, map: ProcessMap) -> Grid {
        let p = (1..=ranks)
            .take_while(|p| p * p <= ranks)
            .filter(|p| ranks.is_multiple_of(*p))
            .max()
            .unwrap_or(1);
        Grid {
            p,
            q: ranks / p.max(1),
            map,
            order: None,
        }
    }

    /// A grid of `p` × `q` laid in rank order.
    pub fn new(p: usize, q: usize, map: ProcessMap) -> Grid {
        Grid {
            p,
            q,
            map,
            order: None,
        }
    }

    pub fn size(&self) -> usize {
        self.p * self.q
    }

    /// (row, column) of a rank.
    pub fn coords(&self, rank: usize) -> (usize, usize) {
        let rank = match &self.order {
            Some(o) => o.iter().position(|&r| r == rank).unwrap_or(rank),
            None => rank,
        };
        match self.map {
            ProcessMap::RowMajor => (rank / self.q, rank % self.q),
            ProcessMap::ColumnMajor => (rank % self.p, rank / self.p),
            ProcessMap::Snake => {
                let (row, at) = (rank / self.q, rank % self.q);
                (
                    row,
                    if row.is_multiple_of(2) {
                        at
                    } else {
                        self.q - 1 - at
                    },
                )
            }
        }
    }

    /// The pairs of ranks in one process row or column: every pair HPL's broadcasts, swaps and
    /// reductions may move data between.
    pub fn group_pairs(&self) -> Vec<[usize; 2]> {
        let mut out = Vec::new();
        let mut add = |members: Vec<usize>| {
            for (i, &a) in members.iter().enumerate() {
                for &b in &members[i + 1..] {
                    out.push([a.min(b), a.max(b)]);
                }
            }
        };
        for row in 0..self.p {
            add((0..self.q).map(|c| self.rank_at(row, c)).collect());
        }
        for col in 0..self.q {
            add((0..self.p).map(|r| self.rank_at(r, col)).collect());
        }
        out
    }

    /// The pairs a grid laid round a ring moves data between: neighbours round each process
    /// row, the last and first of a row of three or more included (its panels go round it,
    /// its small all-reduces along it, the solve's messages are relayed), and every pair of
    /// each process column (pivot rows and swaps go between any two).
    pub fn ring_row_pairs(&self) -> Vec<[usize; 2]> {
        let mut out = Vec::new();
        for row in 0..self.p {
            let members: Vec<usize> = (0..self.q).map(|c| self.rank_at(row, c)).collect();
            let k = members.len();
            for i in 0..k {
                if i + 1 < k || k > 2 {
                    let (a, b) = (members[i], members[(i + 1) % k]);
                    out.push([a.min(b), a.max(b)]);
                }
            }
        }
        for col in 0..self.q {
            let members: Vec<usize> = (0..self.p).map(|r| self.rank_at(r, col)).collect();
            for (i, &a) in members.iter().enumerate() {
                for &b in &members[i + 1..] {
                    out.push([a.min(b), a.max(b)]);
                }
            }
        }
        out
    }

    /// The rank at (row, column).
    pub fn rank_at(&self, row: usize, col: usize) -> usize {
        let seat = self.seat_at(row, col);
        self.order.as_ref().map_or(seat, |o| o[seat])
    }

    /// The seat (place in the map's order) at (row, column).
    fn seat_at(&self, row: usize, col: usize) -> usize {
        match self.map {
            ProcessMap::RowMajor => row * self.q + col,
            ProcessMap::ColumnMajor => col * self.p + row,
            ProcessMap::Snake => {
                row * self.q
                    + if row.is_multiple_of(2) {
                        col
                    } else {
                        self.q - 1 - col
                    }
            }
        }
    }
}

/// How many of `n` indices, dealt in blocks of `nb` over `procs` processes, `me` owns.
pub fn numroc(n: usize, nb: usize, me: usize, procs: usize) -> usize {
    let blocks = n / nb;
    let mut count = (blocks / procs) * nb;
    let extra = blocks % procs;
    if me < extra {
        count += nb;
    } else if me == extra {
        count += n % nb;
    }
    count
}

/// The process owning global index `g`.
pub fn owner(g: usize, nb: usize, procs: usize) -> usize {
    (g / nb) % procs
}

/// Global index `g`'s position in its owner's local array.
pub fn global_to_local(g: usize, nb: usize, procs: usize) -> usize {
    (g / (nb * procs)) * nb + g % nb
}

/// Local index `l` of process `me` as a global index.
pub fn local_to_global(l: usize, nb: usize, me: usize, procs: usize) -> usize {
    ((l / nb) * procs + me) * nb + l % nb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squarest_grids_keep_p_at_most_q() {
        let shape = |n| {
            let g = Grid::squarest(n, ProcessMap::RowMajor);
            (g.p, g.q)
        };
        assert_eq!(
            [shape(1), shape(2), shape(4), shape(6), shape(8), shape(7)],
            [(1, 1), (1, 2), (2, 2), (2, 3), (2, 4), (1, 7)]
        );
    }

    #[test]
    fn rank_maps_invert() {
        for map in [
            ProcessMap::RowMajor,
            ProcessMap::ColumnMajor,
            ProcessMap::Snake,
        ] {
            let g = Grid::new(2, 3, map);
            for r in 0..6 {
                let (row, col) = g.coords(r);
                assert!(row < 2 && col < 3);
                assert_eq!(g.rank_at(row, col), r);
            }
        }
        assert_eq!(Grid::new(2, 3, ProcessMap::RowMajor).coords(4), (1, 1));
        assert_eq!(Grid::new(2, 3, ProcessMap::ColumnMajor).coords(4), (0, 2));
    }

    #[test]
    fn every_index_has_one_owner_and_round_trips() {
        for (n, nb, procs) in [(35, 4, 3), (29, 1, 2), (100, 7, 4), (8, 8, 3), (0, 3, 2)] {
            let counts: Vec<usize> = (0..procs).map(|me| numroc(n, nb, me, procs)).collect();
            assert_eq!(counts.iter().sum::<usize>(), n, "{n} {nb} {procs}");
            let mut seen = vec![0usize; procs];
            for g in 0..n {
                let me = owner(g, nb, procs);
                let l = global_to_local(g, nb, procs);
                assert_eq!(local_to_global(l, nb, me, procs), g);
                assert!(l < counts[me]);
                seen[me] += 1;
            }
            assert_eq!(seen, counts);
        }
    }
}
