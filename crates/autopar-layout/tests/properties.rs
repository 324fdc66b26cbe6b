//! Property tests of the layout algebra over random meshes (up to 64 devices, up to 4 axes),
//! shapes, tensor maps and partial-sum axes.

use autopar_layout::{assemble, plan, scatter, simulate, Block, DeviceMatrix, TensorLayout};
use proptest::prelude::*;

/// A small deterministic generator driven by the proptest seed (failures print the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

fn rng(seed: u64) -> Rng {
    Rng(seed | 1)
}

/// A random mesh: 1 to 4 axes of size 1..=4, at most 64 devices.
fn random_mesh(r: &mut Rng) -> DeviceMatrix {
    loop {
        let n = 1 + r.below(4);
        let dims: Vec<usize> = (0..n).map(|_| 1 + r.below(4)).collect();
        if dims.iter().product::<usize>() <= 64 {
            return DeviceMatrix::new(dims).unwrap();
        }
    }
}

/// Another factorisation of the same device count: prime factors shuffled and grouped.
fn refactor(r: &mut Rng, n: usize) -> DeviceMatrix {
    let mut primes = Vec::new();
    let mut m = n;
    for p in [2, 3, 5, 7] {
        while m.is_multiple_of(p) {
            primes.push(p);
            m /= p;
        }
    }
    if m > 1 {
        primes.push(m);
    }
    r.shuffle(&mut primes);
    let mut dims = Vec::new();
    for p in primes {
        if !dims.is_empty() && dims.len() >= 4 || (!dims.is_empty() && r.below(2) == 0) {
            *dims.last_mut().unwrap() *= p;
        } else {
            dims.push(p);
        }
    }
    if dims.is_empty() || r.below(4) == 0 && dims.len() < 4 {
        dims.insert(r.below(dims.len() + 1), 1);
    }
    DeviceMatrix::new(dims).unwrap()
}

/// Random per-dimension axes (each axis used at most once, random order) and partial axes.
fn random_map(r: &mut Rng, mesh: &DeviceMatrix, ndim: usize, allow_partial: bool) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut map = vec![Vec::new(); ndim];
    let mut partial = Vec::new();
    let mut axes: Vec<usize> = (0..mesh.ndim()).collect();
    r.shuffle(&mut axes);
    for a in axes {
        match r.below(if allow_partial { 4 } else { 3 }) {
            0 => {}
            3 => partial.push(a),
            _ => map[r.below(ndim)].push(a),
        }
    }
    (map, partial)
}

fn split_of(mesh: &DeviceMatrix, axes: &[usize]) -> usize {
    axes.iter().map(|&a| mesh.dims()[a]).product()
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

fn random_tensor(r: &mut Rng, shape: &[usize]) -> Block<i64> {
    Block::from_fn(shape.to_vec(), |_| (r.below(2001) as i64) - 1000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn distinct_slices_partition_the_tensor_and_replicas_agree(seed in any::<u64>()) {
        let mut r = rng(seed);
        let mesh = random_mesh(&mut r);
        let ndim = 1 + r.below(3);
        let (map, _) = random_map(&mut r, &mesh, ndim, false);
        let shape: Vec<usize> = map.iter().map(|axes| split_of(&mesh, axes) * (1 + r.below(3))).collect();
        let l = TensorLayout::new(mesh.clone(), map, shape.clone()).unwrap();
        let total: usize = shape.iter().product();

        // Count how often the distinct slices cover each element: exactly once.
        let mut cover = vec![0u32; total];
        let owners = l.slice_owners();
        prop_assert_eq!(owners.len(), l.num_slices());
        let index = Block::<i64>::from_fn(shape.clone(), |i| i as i64);
        for &o in &owners {
            let s = index.slice(&l.slice_of(o).unwrap()).unwrap();
            prop_assert_eq!(s.shape().to_vec(), l.slice_shape());
            for &i in s.data() { cover[i as usize] += 1; }
        }
        prop_assert!(cover.iter().all(|&c| c == 1), "slices do not partition {:?} under {:?}", shape, l);

        // Ranks of one replica group hold the same slice; ranks with the same slice share a group.
        for rank in 0..mesh.num_devices() {
            let mine = l.slice_of(rank).unwrap();
            let group = l.replica_group(rank).unwrap();
            prop_assert!(group.contains(&rank));
            for &g in &group {
                prop_assert_eq!(&l.slice_of(g).unwrap(), &mine);
            }
            let same: Vec<usize> = (0..mesh.num_devices()).filter(|&o| l.slice_of(o).unwrap() == mine).collect();
            prop_assert_eq!(&same, &group);
            prop_assert_eq!(group.len() * l.num_slices(), mesh.num_devices());
            prop_assert_eq!(l.slice_of(owners[l.slice_index(rank).unwrap()]).unwrap(), mine);
        }
    }

    #[test]
    fn simulating_a_plan_gives_every_rank_its_destination_slice(seed in any::<u64>()) {
        let mut r = rng(seed);
        let src_mesh = random_mesh(&mut r);
        let n = src_mesh.num_devices();
        let dst_mesh = if r.below(2) == 0 { src_mesh.clone() } else { refactor(&mut r, n) };
        let ndim = 1 + r.below(3);
        let (smap, spartial) = random_map(&mut r, &src_mesh, ndim, true);
        let (dmap, dpartial) = random_map(&mut r, &dst_mesh, ndim, true);
        let shape: Vec<usize> = (0..ndim)
            .map(|d| lcm(split_of(&src_mesh, &smap[d]), split_of(&dst_mesh, &dmap[d])) * (1 + r.below(2)))
            .collect();
        let src = TensorLayout::new(src_mesh, smap, shape.clone()).unwrap().with_partial(spartial).unwrap();
        let dst = TensorLayout::new(dst_mesh, dmap, shape.clone()).unwrap().with_partial(dpartial).unwrap();
        let p = plan(&src, &dst).unwrap();
        // Never worse than gathering everything and slicing locally.
        let naive = plan(&src, &TensorLayout::replicated(src.mesh().clone(), shape.clone())).unwrap();
        prop_assert!(p.bytes_sent_per_rank(4) <= naive.bytes_sent_per_rank(4), "plan {} costs more than {}: {} vs {}\n{:?}\n{:?}", p, naive, p.describe(4), naive.describe(4), src, dst);

        let full = random_tensor(&mut r, &shape);
        let mut locals = scatter(&full, &src).unwrap();
        // Spread partial sums unevenly: move a random amount between two members of each group.
        if src.is_partial() {
            for rank in 0..n {
                let group = src.partial_group(rank).unwrap();
                if group[0] == rank && group.len() > 1 {
                    let other = group[1 + r.below(group.len() - 1)];
                    let delta: Vec<i64> = (0..locals[rank].data().len()).map(|_| r.below(200) as i64 - 100).collect();
                    for (i, d) in delta.iter().enumerate() {
                        locals[rank].data_mut()[i] -= d;
                        locals[other].data_mut()[i] += d;
                    }
                }
            }
        }
        prop_assert_eq!(&assemble(&locals, &src).unwrap(), &full);

        let out = simulate(&p, locals).unwrap();
        for rank in 0..n {
            prop_assert_eq!(out[rank].shape().to_vec(), dst.slice_shape(), "rank {} under plan {}", rank, p);
            let want = full.slice(&dst.slice_of(rank).unwrap()).unwrap();
            let mut sum = Block::<i64>::zeros(dst.slice_shape());
            for m in dst.partial_group(rank).unwrap() {
                sum = sum.add(&out[m]).unwrap();
            }
            prop_assert_eq!(&sum, &want, "rank {} wrong after plan {} ({:?} -> {:?})", rank, p, src, dst);
        }
        if !dst.is_partial() {
            prop_assert_eq!(out, scatter(&full, &dst).unwrap());
        }
    }

    #[test]
    fn planning_is_minimal_for_single_axis_moves(seed in any::<u64>()) {
        // Identity is free; S -> R is one all-gather; R -> S is communication-free.
        let mut r = rng(seed);
        let mesh = random_mesh(&mut r);
        let ndim = 1 + r.below(3);
        let (map, _) = random_map(&mut r, &mesh, ndim, false);
        let shape: Vec<usize> = map.iter().map(|axes| split_of(&mesh, axes) * (1 + r.below(3))).collect();
        let l = TensorLayout::new(mesh.clone(), map.clone(), shape.clone()).unwrap();
        prop_assert!(plan(&l, &l).unwrap().is_empty());
        let rep = TensorLayout::replicated(mesh, shape);
        let to_rep = plan(&l, &rep).unwrap();
        let all_gathers = to_rep.ops().all(|s| matches!(s, autopar_layout::Step::AllGather { .. }));
        prop_assert!(all_gathers, "S -> R must only gather: {}", to_rep);
        let nonunit_axes = map.iter().flatten().filter(|&&a| l.mesh().dims()[a] > 1).count();
        prop_assert_eq!(to_rep.steps.len(), nonunit_axes);
        prop_assert_eq!(plan(&rep, &l).unwrap().num_communications(), 0);
    }
}
