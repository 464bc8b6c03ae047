//! GetPreferredAllocation: which `size` devices, out of those kubelet offers, are best
//! connected. Pure: kubelet owns allocation and passes the free IDs; nothing is remembered.
//!
//! Locality of a pair, best first: same PCIe switch (they share a bridge below the root
//! port), same root port, same NUMA node (or root complex), anything. A set is ranked by its
//! worst pair, then by the sum of its pairs' weights, then by how well connected the devices
//! it leaves free are (so a 1-device request takes a lone device rather than split a pair),
//! then by device order. Exact search over every combination up to [`EXACT_LIMIT`] offered
//! devices; beyond, a greedy growth from every seed, which keeps 64 devices in milliseconds
//! (NVIDIA's exhaustive allocator took 16-30 s on 8 GPUs with replicas: k8s-device-plugin #774).

use std::cmp::Ordering;

/// Where a device sits, as far as preference is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Place {
    pub numa: Option<u32>,
    /// Host bridge (`pci0000:00`).
    pub root: Option<String>,
    /// Bridges from the root port down to the device.
    pub bridges: Vec<String>,
}

/// Offered devices at or under this count are searched exhaustively.
pub const EXACT_LIMIT: usize = 16;

/// Pair locality level: 3 switch, 2 root port, 1 NUMA node / root complex, 0 none.
pub fn level(a: &Place, b: &Place) -> u8 {
    let same_root = a.root.is_some() && a.root == b.root;
    if same_root {
        let common = a
            .bridges
            .iter()
            .zip(&b.bridges)
            .take_while(|(x, y)| x == y)
            .count();
        if common >= 2 {
            return 3;
        }
        if common == 1 {
            return 2;
        }
    }
    if same_root || (a.numa.is_some() && a.numa == b.numa) {
        return 1;
    }
    0
}

const WEIGHT: [u32; 4] = [0, 1, 10, 100];

/// The chosen indexes into `places` (ascending), or `None` when the request cannot be met
/// (`size` larger than what is offered, or `must` naming more than `size`).
pub fn choose(places: &[Place], must: &[usize], size: usize) -> Option<Vec<usize>> {
    let n = places.len();
    let mut must: Vec<usize> = must.to_vec();
    must.sort_unstable();
    must.dedup();
    if size > n || must.len() > size || must.iter().any(|&m| m >= n) {
        return None;
    }
    if size == n {
        return Some((0..n).collect());
    }
    let lv: Vec<Vec<u8>> = places
        .iter()
        .map(|a| places.iter().map(|b| level(a, b)).collect())
        .collect();
    let w = |i: usize, j: usize| WEIGHT[lv[i][j] as usize];
    let row: Vec<u32> = (0..n)
        .map(|i| (0..n).filter(|&j| j != i).map(|j| w(i, j)).sum())
        .collect();
    let total: u32 = row.iter().sum::<u32>() / 2;
    let score = |set: &[usize]| -> Key {
        let mut worst = 3u8;
        let mut inner = 0u32;
        for (x, &i) in set.iter().enumerate() {
            for &j in &set[x + 1..] {
                worst = worst.min(lv[i][j]);
                inner += w(i, j);
            }
        }
        let touching: u32 = set.iter().map(|&i| row[i]).sum();
        // Pairs among the devices left free: all pairs, minus those touching the set
        // (pairs inside the set were counted twice in `touching`).
        let left = total + inner - touching;
        Key {
            worst: if set.len() < 2 { 3 } else { worst },
            inner,
            left,
        }
    };
    let rest: Vec<usize> = (0..n).filter(|i| must.binary_search(i).is_err()).collect();
    let mut best: Option<(Key, Vec<usize>)> = None;
    if n <= EXACT_LIMIT {
        let mut search = Exact {
            n,
            link: (0..n * n)
                .map(|k| (lv[k / n][k % n], w(k / n, k % n)))
                .collect(),
            row: &row,
            total,
            size,
            rest: &rest,
            chosen: must.clone(),
            best: None,
        };
        let (mut worst, mut inner) = (3u8, 0u32);
        for (x, &i) in must.iter().enumerate() {
            for &j in &must[x + 1..] {
                worst = worst.min(lv[i][j]);
                inner += w(i, j);
            }
        }
        let touching = must.iter().map(|&i| row[i]).sum();
        search.dfs(0, worst, inner, touching);
        best = search.best;
    } else {
        let seeds: Vec<Vec<usize>> = if must.is_empty() {
            (0..n).map(|i| vec![i]).collect()
        } else {
            vec![must.clone()]
        };
        for seed in seeds {
            let mut set = grow(seed, size, n, &lv, &w);
            set.sort_unstable();
            offer(&mut best, score(&set), &set);
        }
    }
    best.map(|(_, s)| s)
}

/// Keeps `set` (sorted) if it ranks above `best`: a higher key, or the same key and an
/// earlier device order.
fn offer(best: &mut Option<(Key, Vec<usize>)>, key: Key, set: &[usize]) {
    let better = match best {
        None => true,
        Some((bk, bs)) => match key.cmp(bk) {
            Ordering::Greater => true,
            Ordering::Less => false,
            Ordering::Equal => set < &bs[..],
        },
    };
    if better {
        *best = Some((key, set.to_vec()));
    }
}

/// The exhaustive search: every combination of the devices not required, depth first, each
/// step adding one device's links to the running worst level, weight and row sum (so a set
/// costs one row scan, not all its pairs), and abandoning a branch once its worst link is
/// below the best set's: a worst link never improves as devices are added, and it is the
/// first thing sets are ranked by.
struct Exact<'a> {
    n: usize,
    /// Level and weight of each pair, row by row.
    link: Vec<(u8, u32)>,
    row: &'a [u32],
    total: u32,
    size: usize,
    rest: &'a [usize],
    chosen: Vec<usize>,
    best: Option<(Key, Vec<usize>)>,
}

impl Exact<'_> {
    fn dfs(&mut self, from: usize, worst: u8, inner: u32, touching: u32) {
        let missing = self.size - self.chosen.len();
        if missing == 0 {
            let key = Key {
                worst: if self.size < 2 { 3 } else { worst },
                inner,
                // Pairs among the devices left free: all pairs, minus those touching the
                // set (pairs inside it were counted twice in `touching`).
                left: self.total + inner - touching,
            };
            // Sets come in ascending device order (rest is ascending and picks grow left to
            // right, and a required device sits in every set alike), so on an equal key the
            // set already kept is the earlier one and stays.
            if self.best.as_ref().is_some_and(|(b, _)| key <= *b) {
                return;
            }
            let mut set = self.chosen.clone();
            set.sort_unstable();
            self.best = Some((key, set));
            return;
        }
        for p in from..=self.rest.len() - missing {
            let j = self.rest[p];
            let links = &self.link[j * self.n..(j + 1) * self.n];
            let (mut add_worst, mut add) = (3u8, 0u32);
            for &i in &self.chosen {
                let (level, weight) = links[i];
                add_worst = add_worst.min(level);
                add += weight;
            }
            let worst = worst.min(add_worst);
            if self.size >= 2 && self.best.as_ref().is_some_and(|(b, _)| worst < b.worst) {
                continue;
            }
            self.chosen.push(j);
            self.dfs(p + 1, worst, inner + add, touching + self.row[j]);
            self.chosen.pop();
        }
    }
}

/// Adds, one at a time, the device with the best worst-link and then the heaviest links to
/// the set so far, until the set has `size` devices.
fn grow(
    mut set: Vec<usize>,
    size: usize,
    n: usize,
    lv: &[Vec<u8>],
    w: &dyn Fn(usize, usize) -> u32,
) -> Vec<usize> {
    let mut inside = vec![false; n];
    let mut worst = vec![3u8; n];
    let mut sum = vec![0u32; n];
    for &i in &set {
        inside[i] = true;
    }
    for j in 0..n {
        for &i in &set {
            worst[j] = worst[j].min(lv[i][j]);
            sum[j] += w(i, j);
        }
    }
    while set.len() < size {
        let next = (0..n)
            .filter(|&j| !inside[j])
            .max_by(|&a, &b| (worst[a], sum[a]).cmp(&(worst[b], sum[b])).then(b.cmp(&a)))
            .expect("size <= n");
        inside[next] = true;
        set.push(next);
        for j in 0..n {
            worst[j] = worst[j].min(lv[next][j]);
            sum[j] += w(next, j);
        }
    }
    set
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    worst: u8,
    inner: u32,
    left: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(numa: u32, bridges: &[&str]) -> Place {
        Place {
            numa: Some(numa),
            root: Some(format!("pci0000:{:02x}", numa * 0x80)),
            bridges: bridges.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Enflame's guide: gcu0,gcu1 under one switch, gcu2 and gcu3 alone, gcu4,gcu5 under
    /// another switch, gcu6 and gcu7 alone; two sockets.
    fn enflame() -> Vec<Place> {
        vec![
            place(0, &["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]),
            place(0, &["0000:00:01.0", "0000:01:00.0", "0000:02:10.0"]),
            place(0, &["0000:00:02.0"]),
            place(0, &["0000:00:03.0"]),
            place(1, &["0000:80:01.0", "0000:81:00.0", "0000:82:08.0"]),
            place(1, &["0000:80:01.0", "0000:81:00.0", "0000:82:10.0"]),
            place(1, &["0000:80:02.0"]),
            place(1, &["0000:80:03.0"]),
        ]
    }

    #[test]
    fn enflame_guide_example() {
        let p = enflame();
        let first = choose(&p, &[], 2).unwrap();
        assert_eq!(first, [0, 1]);
        let left: Vec<usize> = (2..8).collect();
        let offered: Vec<Place> = left.iter().map(|&i| p[i].clone()).collect();
        let second: Vec<usize> = choose(&offered, &[], 2)
            .unwrap()
            .into_iter()
            .map(|i| left[i])
            .collect();
        assert_eq!(second, [4, 5]);
    }

    #[test]
    fn single_device_keeps_pairs_whole() {
        assert_eq!(choose(&enflame(), &[], 1).unwrap(), [2]);
    }

    #[test]
    fn four_stay_on_one_socket_and_must_include() {
        assert_eq!(choose(&enflame(), &[], 4).unwrap(), [0, 1, 2, 3]);
        // must_include pulls the choice to the other socket, beside gcu6.
        let got = choose(&enflame(), &[6], 3).unwrap();
        assert_eq!(got, [4, 5, 6]);
        assert_eq!(choose(&enflame(), &[1, 2], 2).unwrap(), [1, 2]);
        assert_eq!(choose(&enflame(), &[0, 1, 2], 2), None);
        assert_eq!(choose(&enflame(), &[], 9), None);
    }

    #[test]
    fn greedy_beyond_the_exact_limit() {
        // 64 devices: 16 switches of 4 across 2 NUMA nodes; every 4-request takes one switch.
        let p: Vec<Place> = (0..64u32)
            .map(|i| {
                let sw = i / 4;
                place(
                    sw / 8,
                    &[
                        &format!("0000:{:02x}:01.0", sw),
                        &format!("0000:{:02x}:00.0", sw + 0x40),
                        &format!("0000:{:02x}:{:02x}.0", sw + 0x60, i % 4),
                    ],
                )
            })
            .collect();
        let got = choose(&p, &[], 4).unwrap();
        assert_eq!(got, [0, 1, 2, 3]);
        let got = choose(&p, &[13], 4).unwrap();
        assert_eq!(got, [12, 13, 14, 15]);
        let got = choose(&p, &[], 32).unwrap();
        assert!(got.iter().all(|&i| i < 32), "one NUMA node: {got:?}");
    }

    /// Every combination scored from scratch: what the pruned depth-first search must agree
    /// with, on small topologies drawn from a fixed-seed generator.
    fn brute(places: &[Place], must: &[usize], size: usize) -> Option<Vec<usize>> {
        let n = places.len();
        if size > n || must.len() > size {
            return None;
        }
        let lv = |i: usize, j: usize| level(&places[i], &places[j]);
        let mut best: Option<(Key, Vec<usize>)> = None;
        for mask in 0u32..1 << n {
            if mask.count_ones() as usize != size || must.iter().any(|&m| mask & 1 << m == 0) {
                continue;
            }
            let set: Vec<usize> = (0..n).filter(|&i| mask & 1 << i != 0).collect();
            let (mut worst, mut inner, mut left) = (3u8, 0u32, 0u32);
            for a in 0..n {
                for b in a + 1..n {
                    let (ia, ib) = (set.contains(&a), set.contains(&b));
                    if ia && ib {
                        worst = worst.min(lv(a, b));
                        inner += WEIGHT[lv(a, b) as usize];
                    } else if !ia && !ib {
                        left += WEIGHT[lv(a, b) as usize];
                    }
                }
            }
            let key = Key {
                worst: if size < 2 { 3 } else { worst },
                inner,
                left,
            };
            offer(&mut best, key, &set);
        }
        best.map(|(_, s)| s)
    }

    #[test]
    fn exact_search_agrees_with_brute_force() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m) as u32
        };
        let mut cases = 0;
        for _ in 0..300 {
            let n = 1 + next(10) as usize;
            let places: Vec<Place> = (0..n)
                .map(|_| {
                    let (numa, port, sw) = (next(2), next(3), next(3));
                    let mut bridges = vec![format!("port{numa}{port}")];
                    if sw > 0 {
                        bridges.push(format!("switch{numa}{port}{sw}"));
                        bridges.push(format!("down{}", next(100)));
                    }
                    Place {
                        numa: (next(4) > 0).then_some(numa),
                        root: (next(4) > 0).then(|| format!("pci{numa}")),
                        bridges,
                    }
                })
                .collect();
            for size in 0..=n {
                let must: Vec<usize> = (0..n).filter(|_| next(6) == 0).take(size).collect();
                assert_eq!(
                    choose(&places, &must, size),
                    brute(&places, &must, size),
                    "{places:?} must {must:?} size {size}"
                );
                cases += 1;
            }
        }
        assert!(cases > 1000, "{cases}");
    }
}
