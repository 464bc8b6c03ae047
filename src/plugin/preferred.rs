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

pub use crate::kubelet::inventory::Place;
use crate::profile::ReplicaPolicy;

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

/// A replica: the position of its device among the offered devices, and its number.
pub type Slot = (usize, u32);

/// Which `size` replicas to give, out of those offered. `places[d]` is where offered device
/// `d` sits and `free[d]` its offered (free) replica numbers, ascending and not empty;
/// `must` names replicas that must be among the answer (each one offered). `None` when the
/// request cannot be met: more than is offered, more required than asked for, or more than
/// one replica under `strict`.
///
/// The devices are chosen first and the replicas then taken on them, so the topology
/// search runs over devices, never over replicas: 64 devices of 8 replicas cost what 64
/// devices do. Where the policy leaves several devices equal (as free as each other), the
/// topology ranking of [`choose`] picks among them, beside the devices already in the answer;
/// remaining ties fall to the lower index.
pub fn choose_replicas(
    places: &[Place],
    free: &[Vec<u32>],
    must: &[Slot],
    size: usize,
    policy: ReplicaPolicy,
) -> Option<Vec<Slot>> {
    let n = places.len();
    let mut must = must.to_vec();
    must.sort_unstable();
    must.dedup();
    let total: usize = free.iter().map(Vec::len).sum();
    if free.len() != n
        || size > total
        || must.len() > size
        || (policy == ReplicaPolicy::Strict && size > 1)
        || must.iter().any(|&(d, k)| d >= n || !free[d].contains(&k))
    {
        return None;
    }
    let mut taken: Vec<Vec<u32>> = vec![Vec::new(); n];
    for &(d, k) in &must {
        taken[d].push(k);
    }
    let mut count = must.len();
    let left = |taken: &[Vec<u32>], d: usize| free[d].len() - taken[d].len();
    let take = |taken: &mut [Vec<u32>], d: usize| {
        if let Some(&k) = free[d].iter().find(|k| !taken[d].contains(k)) {
            taken[d].push(k);
        }
    };
    let unused =
        |taken: &[Vec<u32>]| -> Vec<usize> { (0..n).filter(|&d| taken[d].is_empty()).collect() };
    let used =
        |taken: &[Vec<u32>]| -> Vec<usize> { (0..n).filter(|&d| !taken[d].is_empty()).collect() };
    match policy {
        ReplicaPolicy::Pack => {
            // The devices of required replicas first: they are in the answer already.
            for d in used(&taken) {
                while count < size && left(&taken, d) > 0 {
                    take(&mut taken, d);
                    count += 1;
                }
            }
            while count < size {
                let r = size - count;
                let rest = unused(&taken);
                // The device that holds the rest with the fewest replicas to spare (the
                // fullest that fits); where none holds it all, the one that holds the most.
                let fits = rest
                    .iter()
                    .map(|&d| left(&taken, d))
                    .filter(|&l| l >= r)
                    .min();
                let picked = match fits {
                    Some(want) => {
                        let tier: Vec<usize> = rest
                            .into_iter()
                            .filter(|&d| left(&taken, d) == want)
                            .collect();
                        join(places, &used(&taken), &tier, 1)
                    }
                    None => {
                        // As many devices as the freest ones need between them, chosen
                        // together so they are close to each other.
                        let mut lefts: Vec<usize> = rest.iter().map(|&d| left(&taken, d)).collect();
                        lefts.sort_unstable_by(|a, b| b.cmp(a));
                        let (mut sum, mut j) = (0, 0);
                        while sum < r && j < lefts.len() {
                            sum += lefts[j];
                            j += 1;
                        }
                        let floor = *lefts.get(j.checked_sub(1)?)?;
                        let tier: Vec<usize> = rest
                            .into_iter()
                            .filter(|&d| left(&taken, d) >= floor)
                            .collect();
                        let mut picked = join(places, &used(&taken), &tier, j);
                        picked.sort_by_key(|&d| (std::cmp::Reverse(left(&taken, d)), d));
                        picked
                    }
                };
                if picked.is_empty() {
                    return None;
                }
                for d in picked {
                    while count < size && left(&taken, d) > 0 {
                        take(&mut taken, d);
                        count += 1;
                    }
                }
            }
        }
        ReplicaPolicy::Spread | ReplicaPolicy::Strict => {
            // Replicas beyond one per device that the required ones already stack.
            let stacked = must.len() - used(&taken).len();
            let devices = (size - stacked).min(n);
            while used(&taken).len() < devices {
                let need = devices - used(&taken).len();
                let rest = unused(&taken);
                // The least used devices first: those with the most replicas free.
                let most = rest.iter().map(|&d| left(&taken, d)).max()?;
                let tier: Vec<usize> = rest
                    .into_iter()
                    .filter(|&d| left(&taken, d) == most)
                    .collect();
                for d in join(places, &used(&taken), &tier, need.min(tier.len())) {
                    take(&mut taken, d);
                    count += 1;
                }
            }
            // More replicas than devices: round the devices, the least given first.
            while count < size {
                let d = used(&taken)
                    .into_iter()
                    .filter(|&d| left(&taken, d) > 0)
                    .min_by_key(|&d| (taken[d].len(), d))?;
                take(&mut taken, d);
                count += 1;
            }
        }
    }
    let mut out: Vec<Slot> = taken
        .iter()
        .enumerate()
        .flat_map(|(d, ks)| ks.iter().map(move |&k| (d, k)))
        .collect();
    out.sort_unstable();
    Some(out)
}

/// The `k` devices of `tier` that [`choose`] ranks best beside `used` (ascending).
fn join(places: &[Place], used: &[usize], tier: &[usize], k: usize) -> Vec<usize> {
    if tier.len() <= k {
        return tier.to_vec();
    }
    let sub: Vec<Place> = used
        .iter()
        .chain(tier)
        .map(|&d| places[d].clone())
        .collect();
    let must: Vec<usize> = (0..used.len()).collect();
    choose(&sub, &must, used.len() + k)
        .unwrap_or_default()
        .into_iter()
        .filter(|&i| i >= used.len())
        .map(|i| tier[i - used.len()])
        .collect()
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

    fn all_free(n: usize, replicas: u32) -> Vec<Vec<u32>> {
        vec![(0..replicas).collect(); n]
    }

    #[test]
    fn replicas_spread_one_per_device_least_used_first() {
        let p = enflame();
        let spread = |free: &[Vec<u32>], must: &[Slot], size| {
            choose_replicas(&p, free, must, size, ReplicaPolicy::Spread)
        };
        // Two slices: two devices, the switch pair.
        assert_eq!(spread(&all_free(8, 4), &[], 2).unwrap(), [(0, 0), (1, 0)]);
        // One slice: a lone device, pairs kept whole as for whole devices.
        assert_eq!(spread(&all_free(8, 4), &[], 1).unwrap(), [(2, 0)]);
        // gcu2 already lends a replica: the next single slice goes to a device lending none.
        let mut free = all_free(8, 4);
        free[2] = vec![1, 2, 3];
        assert_eq!(spread(&free, &[], 1).unwrap(), [(3, 0)]);
        // More slices than devices: every device once, then round again from the lowest.
        let got = spread(&all_free(8, 4), &[], 10).unwrap();
        assert_eq!(got.len(), 10);
        assert_eq!(got.iter().filter(|s| s.1 == 1).count(), 2);
        // Required replicas stay; beside gcu6, the lone gcu7 rather than split gcu4+5; two
        // required of one device count as one device.
        assert_eq!(
            spread(&all_free(8, 4), &[(6, 2)], 2).unwrap(),
            [(6, 2), (7, 0)]
        );
        assert_eq!(
            spread(&all_free(8, 4), &[(0, 0), (0, 1)], 3).unwrap(),
            [(0, 0), (0, 1), (1, 0)]
        );
    }

    #[test]
    fn replicas_pack_on_as_few_devices_as_possible() {
        let p = enflame();
        let pack = |free: &[Vec<u32>], must: &[Slot], size| {
            choose_replicas(&p, free, must, size, ReplicaPolicy::Pack)
        };
        assert_eq!(pack(&all_free(8, 4), &[], 2).unwrap(), [(2, 0), (2, 1)]);
        // The fullest device that fits: gcu5 has 2 left, the rest 4.
        let mut free = all_free(8, 4);
        free[5] = vec![2, 3];
        assert_eq!(pack(&free, &[], 2).unwrap(), [(5, 2), (5, 3)]);
        // Too many for one device: a whole one, then the rest beside it.
        let got = pack(&all_free(8, 4), &[], 6).unwrap();
        let devices: std::collections::BTreeSet<usize> = got.iter().map(|s| s.0).collect();
        assert_eq!(devices.len(), 2, "{got:?}");
        assert_eq!(level(&p[got[0].0], &p[got[5].0]), 3, "one switch: {got:?}");
        // A required replica's device is filled first.
        assert_eq!(
            pack(&all_free(8, 4), &[(7, 3)], 2).unwrap(),
            [(7, 0), (7, 3)]
        );
    }

    #[test]
    fn replicas_strict_and_impossible_requests() {
        let p = enflame();
        let free = all_free(8, 4);
        assert_eq!(
            choose_replicas(&p, &free, &[], 1, ReplicaPolicy::Strict).unwrap(),
            [(2, 0)]
        );
        assert_eq!(
            choose_replicas(&p, &free, &[], 2, ReplicaPolicy::Strict),
            None
        );
        for policy in [ReplicaPolicy::Pack, ReplicaPolicy::Spread] {
            assert_eq!(choose_replicas(&p, &free, &[], 33, policy), None);
            assert_eq!(choose_replicas(&p, &free, &[(0, 9)], 1, policy), None);
            assert_eq!(
                choose_replicas(&p, &free, &[], 32, policy).unwrap().len(),
                32
            );
        }
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
