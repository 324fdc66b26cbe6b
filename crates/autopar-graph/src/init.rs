//! Seeded, deterministic parameter initialisers (MindSpore's `mindspore.common.initializer`).
//!
//! A parameter's values depend only on its initialiser, shape and seed, never on creation
//! order or thread count; each element's value depends on its index alone (the generator is
//! counter-based), so every rank of a parallel job materialises exactly its own slice
//! ([`Initializer::generate_slice`]), never the full tensor. Fans follow MindSpore: a weight is `[out, in, k...]`,
//! `fan_in = in * prod(k)`, `fan_out = out * prod(k)`.

use std::fmt;
use std::ops::Range;

use crate::error::{GraphError, Result};

/// How a parameter's initial values are drawn.
#[derive(Clone, Debug, PartialEq)]
pub enum Initializer {
    /// All zeros (MindSpore's `Zero`).
    Zeros,
    /// All ones (MindSpore's `One`).
    Ones,
    /// Every element the given value (MindSpore's `Constant`).
    Constant(f64),
    /// N(mean, std^2).
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation; must be non-negative.
        std: f64,
    },
    /// N(mean, std^2) redrawn until within mean +- 2 std.
    TruncatedNormal {
        /// The mean.
        mean: f64,
        /// The standard deviation; must be non-negative.
        std: f64,
    },
    /// U(low, high).
    Uniform {
        /// The lower bound; must not exceed `high`.
        low: f64,
        /// The upper bound.
        high: f64,
    },
    /// Glorot: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).
    XavierUniform {
        /// Gain multiplying the bound (MindSpore's default is 1).
        gain: f64,
    },
    /// Glorot: N(0, gain^2 * 2 / (fan_in + fan_out)).
    XavierNormal {
        /// Gain multiplying the standard deviation (MindSpore's default is 1).
        gain: f64,
    },
    /// Kaiming (fan_in, ReLU gain sqrt(2)): U(-a, a), a = sqrt(6 / fan_in).
    HeUniform,
    /// Kaiming (fan_in, ReLU gain sqrt(2)): N(0, 2 / fan_in).
    HeNormal,
    /// An additive causal attention mask over the last two dimensions `[.., S, T]`: 0 where
    /// `t <= s`, `masked` above the diagonal (a frozen buffer of a decoder).
    CausalMask {
        /// The value above the diagonal (a large negative number, so that softmax ignores those positions).
        masked: f64,
    },
}

impl fmt::Display for Initializer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Initializer::Zeros => write!(f, "zeros"),
            Initializer::Ones => write!(f, "ones"),
            Initializer::Constant(v) => write!(f, "constant({v})"),
            Initializer::Normal { mean, std } => write!(f, "normal({mean}, {std})"),
            Initializer::TruncatedNormal { mean, std } => write!(f, "truncated_normal({mean}, {std})"),
            Initializer::Uniform { low, high } => write!(f, "uniform({low}, {high})"),
            Initializer::XavierUniform { gain } => write!(f, "xavier_uniform({gain})"),
            Initializer::XavierNormal { gain } => write!(f, "xavier_normal({gain})"),
            Initializer::HeUniform => write!(f, "he_uniform"),
            Initializer::HeNormal => write!(f, "he_normal"),
            Initializer::CausalMask { masked } => write!(f, "causal_mask({masked})"),
        }
    }
}

/// `(fan_in, fan_out)` of a weight shaped `[out, in, k...]`.
pub fn fans(shape: &[usize]) -> Option<(usize, usize)> {
    match shape.len() {
        0 => None,
        1 => Some((shape[0], shape[0])),
        _ => {
            let receptive: usize = shape[2..].iter().product();
            Some((shape[1] * receptive, shape[0] * receptive))
        }
    }
}

impl Initializer {
    /// The full tensor's values, row-major, for parameter `name` (used in errors).
    pub fn generate(&self, name: &str, shape: &[usize], seed: u64) -> Result<Vec<f64>> {
        let whole: Vec<Range<usize>> = shape.iter().map(|&d| 0..d).collect();
        self.generate_slice(name, shape, seed, &whole)
    }

    /// The values of the piece `ranges` (one range per dimension) of the tensor of `shape`,
    /// row-major: bit for bit the same as that piece of [`Initializer::generate`]'s tensor,
    /// computed without the rest of it (every element's value depends on its index alone), so
    /// that a rank materialises only its own slice.
    pub fn generate_slice(&self, name: &str, shape: &[usize], seed: u64, ranges: &[Range<usize>]) -> Result<Vec<f64>> {
        self.generate_slice_as(name, shape, seed, ranges, |v| v)
    }

    /// [`Initializer::generate_slice`] with each value converted by `to` as it is made (to the
    /// parameter's storage type), so that no wider intermediate copy of the piece exists.
    pub fn generate_slice_as<T>(
        &self,
        name: &str,
        shape: &[usize],
        seed: u64,
        ranges: &[Range<usize>],
        to: impl Fn(f64) -> T,
    ) -> Result<Vec<T>> {
        let count: usize = ranges.iter().map(|r| r.len()).product();
        self.generate_part_as(name, shape, seed, ranges, 0..count, to)
    }

    /// The elements `part` (positions in the piece's own row-major order) of the piece
    /// `ranges`: what [`Initializer::generate_slice_as`] gives from `part.start` to
    /// `part.end`, made without the rest (ranks holding the same piece each make a part).
    pub fn generate_part_as<T>(
        &self,
        name: &str,
        shape: &[usize],
        seed: u64,
        ranges: &[Range<usize>],
        part: Range<usize>,
        to: impl Fn(f64) -> T,
    ) -> Result<Vec<T>> {
        let bad = |reason: &'static str| GraphError::BadInitializer {
            name: name.to_string(),
            init: self.to_string(),
            shape: shape.to_vec(),
            reason,
        };
        if ranges.len() != shape.len() || ranges.iter().zip(shape).any(|(r, &d)| r.start > r.end || r.end > d) {
            return Err(bad("the slice asked for is not a piece of the tensor"));
        }
        if part.start > part.end || part.end > ranges.iter().map(|r| r.len()).product() {
            return Err(bad("the part asked for is not within the piece"));
        }
        let fan = |reason: &'static str| -> Result<(usize, usize)> {
            match fans(shape) {
                Some((i, o)) if i > 0 && o > 0 => Ok((i, o)),
                _ => Err(bad(reason)),
            }
        };
        let gen = match *self {
            Initializer::Zeros => Gen::Constant(0.0),
            Initializer::Ones => Gen::Constant(1.0),
            Initializer::Constant(v) => Gen::Constant(v),
            Initializer::Normal { mean, std } => {
                if std.is_nan() || std < 0.0 {
                    return Err(bad("std must be non-negative"));
                }
                Gen::Normal { mean: Some(mean), std }
            }
            Initializer::TruncatedNormal { mean, std } => {
                if std.is_nan() || std < 0.0 {
                    return Err(bad("std must be non-negative"));
                }
                Gen::TruncatedNormal { mean, std }
            }
            Initializer::Uniform { low, high } => {
                if low.is_nan() || high.is_nan() || low > high {
                    return Err(bad("low must not exceed high"));
                }
                Gen::Uniform { offset: low, scale: high - low }
            }
            Initializer::XavierUniform { gain } => {
                let (i, o) = fan("xavier needs a weight of rank >= 1 with non-zero fans")?;
                let a = gain * (6.0 / (i + o) as f64).sqrt();
                Gen::Uniform { offset: -a, scale: 2.0 * a }
            }
            Initializer::XavierNormal { gain } => {
                let (i, o) = fan("xavier needs a weight of rank >= 1 with non-zero fans")?;
                Gen::Normal { mean: None, std: gain * (2.0 / (i + o) as f64).sqrt() }
            }
            Initializer::HeUniform => {
                let (i, _) = fan("he needs a weight of rank >= 1 with non-zero fans")?;
                let a = (6.0 / i as f64).sqrt();
                Gen::Uniform { offset: -a, scale: 2.0 * a }
            }
            Initializer::HeNormal => {
                let (i, _) = fan("he needs a weight of rank >= 1 with non-zero fans")?;
                Gen::Normal { mean: None, std: (2.0 / i as f64).sqrt() }
            }
            Initializer::CausalMask { masked } => {
                if shape.len() < 2 {
                    return Err(bad("a causal mask needs at least 2 dimensions [.., S, T]"));
                }
                Gen::CausalMask { s: shape[shape.len() - 2] as u64, t: shape[shape.len() - 1] as u64, masked }
            }
        };
        let mut out = Vec::with_capacity(part.len());
        let mut at = 0usize;
        for_each_run(shape, ranges, |first, len| {
            // The part of this run inside `part`.
            let (from, until) = (at.max(part.start), (at + len).min(part.end));
            if from < until {
                gen.run(seed, first + (from - at) as u64, until - from, &mut out, &to);
            }
            at += len;
        });
        Ok(out)
    }
}

/// An initialiser with its figures worked out: the values of any run of flat indices.
enum Gen {
    Constant(f64),
    /// `mean + std * z` (or `std * z` without a mean), `z` standard normal.
    Normal {
        mean: Option<f64>,
        std: f64,
    },
    TruncatedNormal {
        mean: f64,
        std: f64,
    },
    /// `offset + scale * u`, `u` uniform in [0, 1).
    Uniform {
        offset: f64,
        scale: f64,
    },
    CausalMask {
        s: u64,
        t: u64,
        masked: f64,
    },
}

impl Gen {
    /// Appends the values of the flat indices `first .. first + len` to `out`.
    fn run<T>(&self, seed: u64, first: u64, len: usize, out: &mut Vec<T>, to: &impl Fn(f64) -> T) {
        let end = first + len as u64;
        match *self {
            Gen::Constant(v) => out.extend((0..len).map(|_| to(v))),
            Gen::Normal { mean, std } => {
                let value = |z: f64| match mean {
                    Some(mean) => to(mean + std * z),
                    None => to(std * z),
                };
                let mut k = first;
                while k < end {
                    if k.is_multiple_of(2) && k + 1 < end {
                        // Both halves of one Box-Muller pair from one logarithm and one angle.
                        let (z0, z1) = normal_pair(seed, k);
                        out.push(value(z0));
                        out.push(value(z1));
                        k += 2;
                    } else {
                        out.push(value(normal_at(seed, k)));
                        k += 1;
                    }
                }
            }
            Gen::TruncatedNormal { mean, std } => out.extend((first..end).map(|k| {
                // Each element redraws from a stream of its own until within 2 std.
                let mut rng = Rng::new(splitmix(seed ^ splitmix(k)));
                loop {
                    let z = rng.normal();
                    if z.abs() <= 2.0 {
                        break to(mean + std * z);
                    }
                }
            })),
            Gen::Uniform { offset, scale } => out.extend((first..end).map(|k| to(offset + scale * uniform_at(seed, k)))),
            Gen::CausalMask { s, t, masked } => out.extend((first..end).map(|k| to(if (k % t) <= (k / t) % s { 0.0 } else { masked }))),
        }
    }
}

/// Calls `run(first, len)` for each run of consecutive flat row-major indices, in the tensor
/// of `shape`, that the piece `ranges` covers along its last dimension, in the piece's own
/// row-major order (a scalar is one run of one element; an empty piece has none).
fn for_each_run(shape: &[usize], ranges: &[Range<usize>], mut run: impl FnMut(u64, usize)) {
    let Some((last, outer)) = ranges.split_last() else {
        run(0, 1);
        return;
    };
    if ranges.iter().any(|r| r.is_empty()) {
        return;
    }
    let strides: Vec<u64> = (0..shape.len()).map(|d| shape[d + 1..].iter().product::<usize>() as u64).collect();
    let mut at: Vec<usize> = outer.iter().map(|r| r.start).collect();
    loop {
        let base: u64 = at.iter().zip(&strides).map(|(&i, &s)| i as u64 * s).sum();
        run(base + last.start as u64, last.len());
        // The next row: the innermost outer dimension fastest.
        let mut d = at.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            at[d] += 1;
            if at[d] < outer[d].end {
                break;
            }
            at[d] = outer[d].start;
        }
    }
}

/// Draw `k` (counted from 0) of [`Rng::new`]`(seed)`'s stream, without the draws before it.
fn draw_at(seed: u64, k: u64) -> u64 {
    splitmix(seed.wrapping_add(k.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// The `k`-th [`Rng::uniform`] of `seed`'s stream.
fn uniform_at(seed: u64, k: u64) -> f64 {
    (draw_at(seed, k) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The `k`-th [`Rng::normal`] of `seed`'s stream: the cosine (even `k`) or sine (odd `k`) half
/// of the Box-Muller pair drawn from uniforms `2 * (k / 2)` and the next.
fn normal_at(seed: u64, k: u64) -> f64 {
    let (cos, sin) = normal_pair(seed, k / 2 * 2);
    if k.is_multiple_of(2) {
        cos
    } else {
        sin
    }
}

/// Draws `k` and `k + 1` (`k` even) of [`Rng::normal`]'s stream: one Box-Muller pair.
fn normal_pair(seed: u64, k: u64) -> (f64, f64) {
    let u1 = 1.0 - uniform_at(seed, k);
    let u2 = uniform_at(seed, k + 1);
    let r = (-2.0 * u1.ln()).sqrt();
    let (sin, cos) = (2.0 * std::f64::consts::PI * u2).sin_cos();
    (r * cos, r * sin)
}

/// SplitMix64's increment (the golden ratio in 64 bits).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Seed of a parameter derived from a graph seed and the parameter's name, so that adding a
/// parameter does not change the values of the others.
pub fn derive_seed(graph_seed: u64, name: &str) -> u64 {
    // FNV-1a over the name, mixed with the graph seed through SplitMix64.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    splitmix(graph_seed ^ h)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small deterministic generator (SplitMix64): the same seed gives the same stream everywhere.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    spare: Option<f64>,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed, spare: None }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        splitmix(self.state)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * t.sin());
        r * t.cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(v: &[f64]) -> (f64, f64) {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
        (m, var.sqrt())
    }

    #[test]
    fn the_same_seed_gives_the_same_values_and_another_seed_does_not() {
        let init = Initializer::Normal { mean: 0.0, std: 1.0 };
        let a = init.generate("w", &[8, 8], 7).unwrap();
        assert_eq!(a, init.generate("w", &[8, 8], 7).unwrap());
        assert_ne!(a, init.generate("w", &[8, 8], 8).unwrap());
    }

    #[test]
    fn normal_and_uniform_have_the_requested_moments() {
        let v = Initializer::Normal { mean: 1.0, std: 2.0 }.generate("w", &[200, 100], 1).unwrap();
        let (m, s) = moments(&v);
        assert!((m - 1.0).abs() < 0.05 && (s - 2.0).abs() < 0.05, "{m} {s}");
        let v = Initializer::Uniform { low: -1.0, high: 3.0 }.generate("w", &[20000], 2).unwrap();
        assert!(v.iter().all(|x| (-1.0..3.0).contains(x)));
        assert!((moments(&v).0 - 1.0).abs() < 0.05);
    }

    #[test]
    fn truncated_normal_stays_within_two_std() {
        let v = Initializer::TruncatedNormal { mean: 0.5, std: 0.1 }.generate("w", &[5000], 3).unwrap();
        assert!(v.iter().all(|x| (x - 0.5).abs() <= 0.2 + 1e-12));
    }

    #[test]
    fn xavier_and_he_use_mindspore_fans() {
        assert_eq!(fans(&[64, 32, 3, 3]), Some((288, 576)));
        let a = (6.0f64 / (300.0 + 100.0)).sqrt();
        let v = Initializer::XavierUniform { gain: 1.0 }.generate("w", &[100, 300], 4).unwrap();
        assert!(v.iter().all(|x| x.abs() <= a) && v.iter().any(|x| x.abs() > 0.9 * a));
        let v = Initializer::HeNormal.generate("w", &[200, 400], 5).unwrap();
        assert!((moments(&v).1 - (2.0f64 / 400.0).sqrt()).abs() < 0.003);
    }

    #[test]
    fn constant_initializers_fill_exactly() {
        assert_eq!(Initializer::Constant(2.5).generate("b", &[3], 0).unwrap(), vec![2.5; 3]);
        assert_eq!(Initializer::Zeros.generate("b", &[2], 0).unwrap(), vec![0.0; 2]);
        assert_eq!(Initializer::Ones.generate("b", &[], 0).unwrap(), vec![1.0]);
    }

    #[test]
    fn fan_based_initializers_reject_scalars() {
        let err = Initializer::HeUniform.generate("s", &[], 0).unwrap_err();
        assert!(matches!(err, GraphError::BadInitializer { .. }), "{err}");
    }

    #[test]
    fn derived_seeds_differ_by_name() {
        assert_ne!(derive_seed(0, "l1.w"), derive_seed(0, "l2.w"));
        assert_eq!(derive_seed(3, "l1.w"), derive_seed(3, "l1.w"));
    }

    /// Each element's value from the sequential generator (its own Box-Muller code), drawn up
    /// to the element's flat index: what every fast path must equal.
    fn one_element(init: &Initializer, shape: &[usize], seed: u64, k: u64) -> f64 {
        let (i, o) = fans(shape).unwrap_or((1, 1));
        let (i, o) = (i as f64, o as f64);
        let normal_at = |seed: u64, k: u64| {
            let mut rng = Rng::new(seed);
            for _ in 0..k {
                rng.normal();
            }
            rng.normal()
        };
        let uniform_at = |seed: u64, k: u64| {
            let mut rng = Rng::new(seed);
            for _ in 0..k {
                rng.uniform();
            }
            rng.uniform()
        };
        match *init {
            Initializer::Normal { mean, std } => mean + std * normal_at(seed, k),
            Initializer::XavierNormal { gain } => gain * (2.0 / (i + o)).sqrt() * normal_at(seed, k),
            Initializer::HeNormal => (2.0 / i).sqrt() * normal_at(seed, k),
            Initializer::Uniform { low, high } => low + (high - low) * uniform_at(seed, k),
            Initializer::XavierUniform { gain } => {
                let a = gain * (6.0 / (i + o)).sqrt();
                -a + 2.0 * a * uniform_at(seed, k)
            }
            _ => unreachable!("only the drawn initialisers are compared"),
        }
    }

    proptest::proptest! {
        #[test]
        fn any_piece_of_any_shape_equals_its_elements_drawn_one_by_one(
            dims in proptest::collection::vec((1usize..7, 0usize..7, 0usize..7), 1..4),
            which in 0usize..5,
            seed in 0u64..1000,
        ) {
            let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
            let piece: Vec<Range<usize>> = dims
                .iter()
                .map(|&(n, a, b)| {
                    let (a, b) = (a % (n + 1), b % (n + 1));
                    a.min(b)..a.max(b)
                })
                .collect();
            let init = [
                Initializer::Normal { mean: 0.5, std: 2.0 },
                Initializer::XavierNormal { gain: 1.5 },
                Initializer::HeNormal,
                Initializer::Uniform { low: -1.0, high: 2.0 },
                Initializer::XavierUniform { gain: 1.0 },
            ][which]
                .clone();
            let strides: Vec<usize> = (0..shape.len()).map(|d| shape[d + 1..].iter().product()).collect();
            let mut want = Vec::new();
            let mut at: Vec<usize> = piece.iter().map(|r| r.start).collect();
            let count: usize = piece.iter().map(|r| r.len()).product();
            for n in 0..count {
                if n > 0 {
                    for d in (0..at.len()).rev() {
                        at[d] += 1;
                        if at[d] < piece[d].end {
                            break;
                        }
                        at[d] = piece[d].start;
                    }
                }
                let k: usize = at.iter().zip(&strides).map(|(i, s)| i * s).sum();
                want.push(one_element(&init, &shape, seed, k as u64).to_bits());
            }
            let got: Vec<u64> = init.generate_slice("w", &shape, seed, &piece).unwrap().iter().map(|v| v.to_bits()).collect();
            proptest::prop_assert_eq!(got, want, "{} of {:?} piece {:?}", init, shape, piece);
        }
    }

    #[test]
    fn parts_of_a_piece_joined_are_the_piece() {
        let (shape, piece) = ([6, 5, 4], [1..4, 0..5, 1..4]);
        for init in [
            Initializer::Normal { mean: 0.0, std: 1.0 },
            Initializer::Uniform { low: 0.0, high: 1.0 },
            Initializer::CausalMask { masked: -1.0 },
        ] {
            let whole = init.generate_slice("w", &shape, 3, &piece).unwrap();
            for cuts in [vec![0, 45], vec![0, 7, 8, 30, 45], vec![0, 1, 2, 3, 44, 45]] {
                let joined: Vec<f64> =
                    cuts.windows(2).flat_map(|c| init.generate_part_as("w", &shape, 3, &piece, c[0]..c[1], |v| v).unwrap()).collect();
                assert_eq!(joined, whole, "{init} cut at {cuts:?}");
            }
            assert!(init.generate_part_as("w", &shape, 3, &piece, 40..46, |v| v).is_err());
        }
    }

    #[test]
    fn every_initializer_gives_any_slice_equal_to_the_same_piece_of_the_full_tensor() {
        let shape = [6, 5, 4];
        let piece = [1..4, 0..5, 2..3];
        for init in [
            Initializer::Zeros,
            Initializer::Ones,
            Initializer::Constant(0.25),
            Initializer::Normal { mean: 0.5, std: 2.0 },
            Initializer::TruncatedNormal { mean: 0.0, std: 1.0 },
            Initializer::Uniform { low: -1.0, high: 2.0 },
            Initializer::XavierUniform { gain: 1.0 },
            Initializer::XavierNormal { gain: 2.0 },
            Initializer::HeUniform,
            Initializer::HeNormal,
            Initializer::CausalMask { masked: -1e9 },
        ] {
            let full = init.generate("w", &shape, 11).unwrap();
            let mut want: Vec<u64> = Vec::new();
            for i in piece[0].clone() {
                for j in piece[1].clone() {
                    for k in piece[2].clone() {
                        want.push(full[i * 20 + j * 4 + k].to_bits());
                    }
                }
            }
            let got: Vec<u64> = init.generate_slice("w", &shape, 11, &piece).unwrap().iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{init}");
        }
        // The counter-based streams are the sequential generator's, draw for draw.
        let mut rng = Rng::new(5);
        let seq: Vec<f64> = (0..7).map(|_| rng.normal()).collect();
        assert_eq!(seq, Initializer::Normal { mean: 0.0, std: 1.0 }.generate("n", &[7], 5).unwrap());
        let mut rng = Rng::new(9);
        let seq: Vec<f64> = (0..7).map(|_| rng.uniform()).collect();
        assert_eq!(seq, Initializer::Uniform { low: 0.0, high: 1.0 }.generate("u", &[7], 9).unwrap());
        let err = Initializer::Ones.generate_slice("w", &[2, 2], 0, &[0..3, 0..2]).unwrap_err();
        assert!(matches!(err, GraphError::BadInitializer { .. }), "{err}");
    }
}
