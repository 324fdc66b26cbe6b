//! Per-rank sharding with epoch-based reshuffling, as MindSpore's `DistributedSampler`.
//!
//! Each epoch every shard computes the same permutation of `0..len` (from `(seed, epoch)`, or the
//! identity without shuffling) and takes the positions `shard_id, shard_id + num_shards, ...` of it.
//! With [`ShardPadding::None`] every sample is in exactly one shard once per epoch; shard sizes
//! differ by at most one (the first `len % num_shards` shards hold one more). With
//! [`ShardPadding::WrapAround`] every shard holds `ceil(len / num_shards)` samples, positions
//! wrapping past the end, so ranks run equal step counts and a few samples are seen twice (the
//! behaviour of MindSpore's default even distribution).
//!
//! Interleaving makes data parallelism equal serial training: batch `j` of each of `k` shards with
//! batch size `b` together hold exactly the samples of batch `j` of one unsharded run with batch
//! size `k * b` (when every shard has that batch in full).

use crate::error::{DataError, Result};
use crate::rng::{Rng, Stream};

/// How shards of unequal size are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardPadding {
    /// Every sample exactly once per epoch; shards differ in size by at most one.
    #[default]
    None,
    /// Equal shards of `ceil(len / num_shards)`, wrapping around to the permutation's start.
    WrapAround,
}

/// Which samples one shard sees in each epoch, and in which order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSampler {
    len: usize,
    num_shards: usize,
    shard_id: usize,
    shuffle: bool,
    seed: u64,
    padding: ShardPadding,
}

impl ShardSampler {
    /// A sampler over `len` samples for shard `shard_id` of `num_shards`.
    pub fn new(len: usize, num_shards: usize, shard_id: usize, shuffle: bool, seed: u64, padding: ShardPadding) -> Result<Self> {
        if num_shards == 0 {
            return Err(DataError::InvalidOption {
                param: "num_shards",
                value: "0".into(),
                expected: "at least 1".into(),
                hint: "num_shards is the number of data-parallel ranks".into(),
            });
        }
        if shard_id >= num_shards {
            return Err(DataError::InvalidOption {
                param: "shard_id",
                value: shard_id.to_string(),
                expected: format!("a shard in 0..{num_shards}"),
                hint: "shard_id is this rank's index among the data-parallel ranks".into(),
            });
        }
        Ok(ShardSampler { len, num_shards, shard_id, shuffle, seed, padding })
    }

    /// Samples in the whole dataset.
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.num_shards
    }

    /// This shard.
    pub fn shard_id(&self) -> usize {
        self.shard_id
    }

    /// Samples this shard sees per epoch.
    pub fn shard_len(&self) -> usize {
        self.shard_len_of(self.shard_id)
    }

    /// Samples shard `shard` sees per epoch.
    pub fn shard_len_of(&self, shard: usize) -> usize {
        match self.padding {
            ShardPadding::None => (self.len + self.num_shards - 1 - shard) / self.num_shards,
            ShardPadding::WrapAround if self.len == 0 => 0,
            ShardPadding::WrapAround => self.len.div_ceil(self.num_shards),
        }
    }

    /// The whole dataset's order in `epoch` (the same on every shard).
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            Rng::keyed(Stream::Shuffle, &[self.seed, epoch]).shuffle(&mut order);
        }
        order
    }

    /// This shard's samples in `epoch`, in the order they are batched.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let order = self.epoch_order(epoch);
        (0..self.shard_len()).map(|i| order[(self.shard_id + i * self.num_shards) % self.len]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_sample_is_in_exactly_one_shard_once_per_epoch(len in 1usize..300, num_shards in 1usize..9, seed in any::<u64>(), epoch in 0u64..4, shuffle in any::<bool>()) {
            let mut count = vec![0usize; len];
            let mut sizes = vec![];
            for s in 0..num_shards {
                let sampler = ShardSampler::new(len, num_shards, s, shuffle, seed, ShardPadding::None).unwrap();
                let idx = sampler.indices(epoch);
                prop_assert_eq!(idx.len(), sampler.shard_len());
                sizes.push(idx.len());
                for i in idx { count[i] += 1; }
            }
            prop_assert!(count.iter().all(|&c| c == 1), "counts {:?}", count);
            prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }

        #[test]
        fn wrap_around_shards_are_equal_and_cover_every_sample(len in 1usize..300, num_shards in 1usize..9, seed in any::<u64>()) {
            let mut count = vec![0usize; len];
            for s in 0..num_shards {
                let idx = ShardSampler::new(len, num_shards, s, true, seed, ShardPadding::WrapAround).unwrap().indices(1);
                prop_assert_eq!(idx.len(), len.div_ceil(num_shards));
                for i in idx { count[i] += 1; }
            }
            let (lo, hi) = (*count.iter().min().unwrap(), *count.iter().max().unwrap());
            prop_assert!(lo >= 1 && hi - lo <= 1, "counts {:?}", count);
            prop_assert_eq!(count.iter().sum::<usize>(), len.div_ceil(num_shards) * num_shards);
        }
    }

    #[test]
    fn epochs_reshuffle_and_the_same_epoch_repeats() {
        let s = ShardSampler::new(100, 2, 1, true, 42, ShardPadding::None).unwrap();
        assert_eq!(s.indices(3), s.indices(3));
        assert_ne!(s.indices(3), s.indices(4));
        let other_seed = ShardSampler::new(100, 2, 1, true, 43, ShardPadding::None).unwrap();
        assert_ne!(s.indices(3), other_seed.indices(3));
    }

    #[test]
    fn without_shuffle_shards_interleave_in_file_order() {
        let s = ShardSampler::new(7, 3, 1, false, 0, ShardPadding::None).unwrap();
        assert_eq!(s.indices(0), vec![1, 4]);
        assert_eq!(ShardSampler::new(7, 3, 0, false, 0, ShardPadding::None).unwrap().indices(5), vec![0, 3, 6]);
        assert_eq!(ShardSampler::new(7, 3, 2, false, 0, ShardPadding::WrapAround).unwrap().indices(0), vec![2, 5, 1]);
    }

    #[test]
    fn a_shard_id_outside_num_shards_is_rejected() {
        let err = ShardSampler::new(10, 4, 4, true, 0, ShardPadding::None).unwrap_err();
        assert!(err.to_string().contains("shard_id = 4") && err.to_string().contains("0..4"), "{err}");
        assert!(ShardSampler::new(10, 0, 0, true, 0, ShardPadding::None).is_err());
    }
}
