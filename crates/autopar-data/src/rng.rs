//! Deterministic random numbers, written out here so that a dataset's order, its augmentations and
//! its synthetic samples are bit-identical across platforms, crate upgrades and thread counts.
//!
//! Every random decision draws from a generator keyed by what it is about: the epoch's shuffle from
//! `(seed, epoch)`, a sample's augmentation from `(seed, epoch, global sample index)`, a synthetic
//! sample from `(seed, index)`. Nothing depends on which shard, thread or batch happens to do the work.

/// Which kind of decision a generator serves; keeps the streams of one seed apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Shuffle = 1,
    Augment = 2,
    SyntheticSample = 3,
    SyntheticParams = 4,
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Folds a list of keys into one 64-bit seed (order matters).
pub(crate) fn mix(keys: &[u64]) -> u64 {
    let mut state = 0x6A09_E667_F3BC_C908u64;
    let mut acc = 0u64;
    for &k in keys {
        state ^= k;
        acc = splitmix64(&mut state) ^ acc.rotate_left(17);
    }
    acc
}

/// xoshiro256** seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for one seed.
    pub fn new(seed: u64) -> Self {
        let mut st = seed;
        let s = [splitmix64(&mut st), splitmix64(&mut st), splitmix64(&mut st), splitmix64(&mut st)];
        Rng { s }
    }

    pub(crate) fn keyed(stream: Stream, keys: &[u64]) -> Self {
        Rng::new(mix(&[stream as u64, mix(keys)]))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..n` without modulo bias (Lemire's method); `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = (self.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller, one value per call).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Fills `out` with standard normal values, two per Box-Muller draw (the cosine and the
    /// sine of one angle): half the logarithms and square roots of [`Rng::normal`].
    pub fn fill_normal(&mut self, out: &mut [f32]) {
        let mut pairs = out.chunks_exact_mut(2);
        for pair in &mut pairs {
            let (c, s) = self.normal_pair();
            pair[0] = c as f32;
            pair[1] = s as f32;
        }
        if let [last] = pairs.into_remainder() {
            *last = self.normal_pair().0 as f32;
        }
    }

    fn normal_pair(&mut self) -> (f64, f64) {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        (r * c, r * s)
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_same_sequence_and_different_seeds_differ() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let c: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::new(8);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn mix_depends_on_order_and_every_key() {
        assert_ne!(mix(&[1, 2]), mix(&[2, 1]));
        assert_ne!(mix(&[1, 2, 3]), mix(&[1, 2, 4]));
        assert_eq!(mix(&[5, 6]), mix(&[5, 6]));
    }

    #[test]
    fn below_stays_in_range_and_hits_every_value() {
        let mut r = Rng::new(1);
        let mut seen = [0usize; 7];
        for _ in 0..7000 {
            let v = r.below(7) as usize;
            seen[v] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800 && c < 1200), "{seen:?}");
    }

    #[test]
    fn normal_has_zero_mean_and_unit_variance() {
        let mut r = Rng::new(3);
        let n = 20000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
    }

    #[test]
    fn filled_normals_have_zero_mean_unit_variance_and_no_correlation_between_neighbours() {
        let mut r = Rng::new(5);
        let mut xs = vec![0f32; 20001];
        r.fill_normal(&mut xs);
        let n = xs.len() as f64;
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        let cov = xs.chunks_exact(2).map(|p| p[0] as f64 * p[1] as f64).sum::<f64>() / (n / 2.0);
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05 && cov.abs() < 0.05, "mean {mean} var {var} cov {cov}");
        assert_ne!(xs[20000], 0.0, "an odd length fills the last value too");
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<usize> = (0..100).collect();
        Rng::new(9).shuffle(&mut v);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
    }
}
