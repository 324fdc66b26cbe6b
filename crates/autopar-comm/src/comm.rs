//! The [`Communicator`] trait: the only way autopar's ranks talk to each other.

use crate::dtype::{Buf, BufMut, DType, Element, ReduceOp};
use crate::error::{CommError, GroupProblem, Result, MAX_TAG};

/// A group of ranks and the collectives they run together.
///
/// Object safe: the runtime holds a `Box<dyn Communicator>` (or `&dyn Communicator`) and never
/// knows whether the ranks are threads ([`crate::LocalComm`]) or processes
/// (`MpiComm`, feature `mpi`). Buffers are type-tagged ([`Buf`], [`BufMut`]); `(&mut v).into()`
/// turns a `Vec`/slice of f16, bf16, f32, f64, i32 or i64 into one.
///
/// Every rank of the group must call the same collectives in the same order with matching
/// arguments (element type, lengths, operation, root); backends report a disagreement as an
/// error where they can see it. Ranks are numbered within the group, `0..size()`.
pub trait Communicator: Send {
    /// This rank within the group.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn size(&self) -> usize;
    /// The global (world) rank of each member of this group, indexed by group rank.
    fn world_ranks(&self) -> &[usize];
    /// Short backend name for logs (`local`, `mpi`).
    fn backend(&self) -> &'static str;

    /// Reduce `buf` over all ranks, in place; every rank gets the result.
    fn all_reduce(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<()>;
    /// Reduce each of `parts` over all ranks, in place, as one all-reduce of their
    /// concatenation (a fused gradient bucket): every rank passes parts of one element type
    /// with the same lengths in the same order; the results are those of [`all_reduce`] on
    /// the concatenation, bit for bit. By default the parts are copied into one buffer and
    /// back; [`crate::LocalComm`] reduces them where they lie.
    ///
    /// [`all_reduce`]: Communicator::all_reduce
    fn all_reduce_parts(&self, parts: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
        packed_all_reduce(self, parts, op)
    }
    /// Concatenate every rank's `send` in rank order into `recv` (`size()` times as long).
    fn all_gather(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<()>;
    /// All-gather each of `send` into the `recv` part of the same index (`size()` times as
    /// long: every rank's `send[i]` in rank order), as one all-gather of the concatenated
    /// sends (a fused bucket of sharded parameters): every rank passes parts of one element
    /// type with the same lengths in the same order. By default the sends are copied into one
    /// buffer and the result out of one; [`crate::LocalComm`] copies each part from where it
    /// lies to where it goes.
    fn all_gather_parts(&self, send: &[Buf<'_>], recv: &mut [BufMut<'_>]) -> Result<()> {
        packed_all_gather(self, send, recv)
    }
    /// Reduce `send` (`size()` equal blocks) over all ranks; rank r keeps block r in `recv`.
    fn reduce_scatter(&self, send: Buf<'_>, recv: BufMut<'_>, op: ReduceOp) -> Result<()>;
    /// Reduce-scatter each of `send` (`size()` equal blocks) into the `recv` part of the same
    /// index (rank r keeps block r), as one reduce-scatter of a buffer holding, for each rank
    /// in turn, its block of every part (a fused bucket of gradients): the same bits, the same
    /// rules as [`all_gather_parts`]. By default packed; [`crate::LocalComm`] reduces the
    /// blocks where they lie.
    ///
    /// [`all_gather_parts`]: Communicator::all_gather_parts
    fn reduce_scatter_parts(&self, send: &[Buf<'_>], recv: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
        packed_reduce_scatter(self, send, recv, op)
    }
    /// Copy `buf` of rank `root` into `buf` of every rank.
    fn broadcast(&self, buf: BufMut<'_>, root: usize) -> Result<()>;
    /// Block j of `send` goes to rank j; block i of `recv` comes from rank i (`size()` equal
    /// blocks each; both buffers have the same length).
    fn all_to_all(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<()>;
    /// Send `buf` to rank `dest` with `tag` (0..=32767).
    fn send(&self, buf: Buf<'_>, dest: usize, tag: u32) -> Result<()>;
    /// Receive the next message from rank `src` with `tag` into `buf` (same type and length).
    fn recv(&self, buf: BufMut<'_>, src: usize, tag: u32) -> Result<()>;
    /// Wait until every rank has arrived.
    fn barrier(&self) -> Result<()>;
    /// Collective over this group: every rank passes the same list of disjoint groups (lists
    /// of ranks of this group, e.g. from `DeviceMatrix::groups_along`); each rank gets the
    /// sub-communicator of the group holding it, ranked in list order, or `None` when no group
    /// lists it.
    fn split(&self, groups: &[Vec<usize>]) -> Result<Option<Box<dyn Communicator>>>;
}

impl std::fmt::Debug for dyn Communicator + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} communicator: rank {} of {} (world ranks {:?})", self.backend(), self.rank(), self.size(), self.world_ranks())
    }
}

/// The element type shared by `parts` (None when there are none), or an error naming the first
/// part of another type; `rank` (counted in the world) is the caller's, for the error.
pub(crate) fn parts_dtype(op: &'static str, parts: impl IntoIterator<Item = DType>, rank: usize) -> Result<Option<DType>> {
    let mut parts = parts.into_iter().enumerate();
    let Some((_, first)) = parts.next() else {
        return Ok(None);
    };
    match parts.find(|&(_, d)| d != first) {
        Some((part, got)) => Err(CommError::MixedParts { op, rank, part, got, expected: first }),
        None => Ok(Some(first)),
    }
}

/// The checks of a call of parts on its own rank ([`Communicator::all_gather_parts`],
/// [`Communicator::reduce_scatter_parts`]): as many receive parts as send parts, one element
/// type, and each receive part `size()` times (gather) or `1 / size()` of (scatter) its send
/// part. Returns the element type (None: no parts).
pub(crate) fn check_parts(c: &Check<'_>, send: &[Buf<'_>], recv: &[BufMut<'_>], gather: bool) -> Result<Option<DType>> {
    c.len("list of receive parts", recv.len(), send.len(), "pass one receive part for each send part")?;
    let dtype = parts_dtype(c.op, send.iter().map(Buf::dtype), c.rank)?;
    for (s, r) in send.iter().zip(recv) {
        c.same_dtype(s, r)?;
        if gather {
            c.len(
                "receive part",
                r.len(),
                s.len() * c.size,
                "each receive part holds its send part from every rank: recv = send x group size",
            )?;
        } else {
            c.divisible("send part", s.len())?;
            c.len("receive part", r.len(), s.len() / c.size, "each send part holds one block per rank: recv = send / group size")?;
        }
    }
    Ok(dtype)
}

/// [`Communicator::all_reduce_parts`] through one packed buffer: the parts copied in, one
/// [`Communicator::all_reduce`], the results copied back.
pub(crate) fn packed_all_reduce<C: Communicator + ?Sized>(comm: &C, parts: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
    fn packed<T: Element, C: Communicator + ?Sized>(comm: &C, parts: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
        let mut flat: Vec<T> = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for p in parts.iter() {
            flat.extend_from_slice(T::from_buf(&p.as_buf()).expect("the parts share the element type"));
        }
        comm.all_reduce(T::buf_mut(&mut flat), op)?;
        let mut at = 0;
        for p in parts.iter_mut() {
            let n = p.len();
            p.as_bytes_mut().copy_from_slice(T::buf(&flat[at..at + n]).as_bytes());
            at += n;
        }
        Ok(())
    }
    let rank = comm.world_ranks().get(comm.rank()).copied().unwrap_or(comm.rank());
    match parts_dtype("all_reduce_parts", parts.iter().map(BufMut::dtype), rank)? {
        // No parts: still one (empty) collective, so every rank counts the same calls.
        None => comm.all_reduce(BufMut::F32(&mut []), op),
        Some(DType::F16) => packed::<half::f16, C>(comm, parts, op),
        Some(DType::BF16) => packed::<half::bf16, C>(comm, parts, op),
        Some(DType::F32) => packed::<f32, C>(comm, parts, op),
        Some(DType::F64) => packed::<f64, C>(comm, parts, op),
        Some(DType::I32) => packed::<i32, C>(comm, parts, op),
        Some(DType::I64) => packed::<i64, C>(comm, parts, op),
    }
}

/// The part lengths of `send`, and their sum.
fn part_lens(send: &[Buf<'_>]) -> (Vec<usize>, usize) {
    let lens: Vec<usize> = send.iter().map(Buf::len).collect();
    let total = lens.iter().sum();
    (lens, total)
}

/// Calls `$f::<T, C>(...)` for the element type `$dtype` (None: f32, an empty call).
macro_rules! for_dtype {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype.unwrap_or(DType::F32) {
            DType::F16 => $f::<half::f16, C>($($arg),*),
            DType::BF16 => $f::<half::bf16, C>($($arg),*),
            DType::F32 => $f::<f32, C>($($arg),*),
            DType::F64 => $f::<f64, C>($($arg),*),
            DType::I32 => $f::<i32, C>($($arg),*),
            DType::I64 => $f::<i64, C>($($arg),*),
        }
    };
}

/// [`Communicator::all_gather_parts`] through one packed buffer: the sends concatenated, one
/// [`Communicator::all_gather`], each rank's pieces copied out to their parts.
pub(crate) fn packed_all_gather<C: Communicator + ?Sized>(comm: &C, send: &[Buf<'_>], recv: &mut [BufMut<'_>]) -> Result<()> {
    fn packed<T: Element, C: Communicator + ?Sized>(comm: &C, send: &[Buf<'_>], recv: &mut [BufMut<'_>]) -> Result<()> {
        let (lens, total) = part_lens(send);
        let mut flat: Vec<T> = Vec::with_capacity(total);
        for p in send {
            flat.extend_from_slice(T::from_buf(p).expect("the parts share the element type"));
        }
        let mut all = vec![T::narrow(T::Acc::default()); total * comm.size()];
        comm.all_gather(T::buf(&flat), T::buf_mut(&mut all))?;
        let es = std::mem::size_of::<T>();
        let mut at = 0;
        for (r, len) in recv.iter_mut().zip(lens) {
            if len > 0 {
                for (k, block) in r.as_bytes_mut().chunks_exact_mut(len * es).enumerate() {
                    block.copy_from_slice(T::buf(&all[k * total + at..k * total + at + len]).as_bytes());
                }
            }
            at += len;
        }
        Ok(())
    }
    let dtype = check_parts(&own_check(comm, "all_gather_parts"), send, recv, true)?;
    for_dtype!(dtype, packed, comm, send, recv)
}

/// [`Communicator::reduce_scatter_parts`] through one packed buffer: for each rank in turn its
/// block of every part, one [`Communicator::reduce_scatter`], the result copied out to the parts.
pub(crate) fn packed_reduce_scatter<C: Communicator + ?Sized>(
    comm: &C,
    send: &[Buf<'_>],
    recv: &mut [BufMut<'_>],
    op: ReduceOp,
) -> Result<()> {
    fn packed<T: Element, C: Communicator + ?Sized>(comm: &C, send: &[Buf<'_>], recv: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
        let n = comm.size();
        let lens: Vec<usize> = recv.iter().map(BufMut::len).collect();
        let total: usize = lens.iter().sum();
        let mut flat: Vec<T> = Vec::with_capacity(total * n);
        for k in 0..n {
            for (p, &len) in send.iter().zip(&lens) {
                flat.extend_from_slice(&T::from_buf(p).expect("the parts share the element type")[k * len..(k + 1) * len]);
            }
        }
        let mut mine = vec![T::narrow(T::Acc::default()); total];
        comm.reduce_scatter(T::buf(&flat), T::buf_mut(&mut mine), op)?;
        let mut at = 0;
        for (r, len) in recv.iter_mut().zip(lens) {
            r.as_bytes_mut().copy_from_slice(T::buf(&mine[at..at + len]).as_bytes());
            at += len;
        }
        Ok(())
    }
    let dtype = check_parts(&own_check(comm, "reduce_scatter_parts"), send, recv, false)?;
    for_dtype!(dtype, packed, comm, send, recv, op)
}

/// The checks of `op` on the caller's rank, for a default method that knows only the trait.
fn own_check<'a, C: Communicator + ?Sized>(comm: &'a C, op: &'static str) -> Check<'a> {
    let world = comm.world_ranks();
    Check { op, rank: world.get(comm.rank()).copied().unwrap_or(comm.rank()), size: comm.size(), _world: world }
}

/// The arguments a collective checks on its own rank before it talks to anyone.
pub(crate) struct Check<'a> {
    pub op: &'static str,
    pub rank: usize,
    pub size: usize,
    pub _world: &'a [usize],
}

impl Check<'_> {
    pub fn same_dtype(&self, send: &Buf<'_>, recv: &BufMut<'_>) -> Result<()> {
        if send.dtype() != recv.dtype() {
            return Err(CommError::DTypeMismatch { op: self.op, rank: self.rank, send: send.dtype(), recv: recv.dtype() });
        }
        Ok(())
    }

    pub fn len(&self, what: &'static str, got: usize, expected: usize, hint: &'static str) -> Result<()> {
        if got != expected {
            return Err(CommError::BufferSize { op: self.op, rank: self.rank, what, got, expected, hint });
        }
        Ok(())
    }

    pub fn divisible(&self, what: &'static str, len: usize) -> Result<()> {
        if len.checked_rem(self.size) != Some(0) {
            let expected = len.div_ceil(self.size) * self.size;
            return Err(CommError::BufferSize {
                op: self.op,
                rank: self.rank,
                what,
                got: len,
                expected,
                hint: "the buffer is split into one equal block per rank; its length must be a multiple of the group size",
            });
        }
        Ok(())
    }

    pub fn peer(&self, what: &'static str, peer: usize) -> Result<()> {
        if peer >= self.size {
            return Err(CommError::RankOutOfRange { op: self.op, rank: self.rank, what, peer, size: self.size });
        }
        Ok(())
    }

    pub fn p2p(&self, peer: usize, own_rank: usize, tag: u32) -> Result<()> {
        self.peer(if self.op == "send" { "destination" } else { "source" }, peer)?;
        if peer == own_rank {
            return Err(CommError::SelfMessage { op: self.op, rank: self.rank });
        }
        if tag > MAX_TAG {
            return Err(CommError::TagOutOfRange { op: self.op, rank: self.rank, tag, max: MAX_TAG });
        }
        Ok(())
    }
}

/// Check a list of groups against a parent of `size` ranks; returns, for each parent rank,
/// its (group index, position) if listed.
pub(crate) fn validate_groups(groups: &[Vec<usize>], size: usize, world_rank: usize) -> Result<Vec<Option<(usize, usize)>>> {
    let mut placed = vec![None; size];
    for (index, g) in groups.iter().enumerate() {
        if g.is_empty() {
            return Err(CommError::InvalidGroups { rank: world_rank, problem: GroupProblem::Empty { index } });
        }
        for (pos, &member) in g.iter().enumerate() {
            if member >= size {
                return Err(CommError::InvalidGroups { rank: world_rank, problem: GroupProblem::OutOfRange { index, member, size } });
            }
            if placed[member].is_some() {
                return Err(CommError::InvalidGroups { rank: world_rank, problem: GroupProblem::Duplicate { member } });
            }
            placed[member] = Some((index, pos));
        }
    }
    Ok(placed)
}

/// A stable 64-bit fingerprint of a list of groups (FNV-1a), so ranks can check they agree.
pub(crate) fn groups_hash(groups: &[Vec<usize>]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(groups.len() as u64);
    for g in groups {
        eat(g.len() as u64);
        for &r in g {
            eat(r as u64);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_must_be_disjoint_non_empty_and_in_range() {
        assert!(validate_groups(&[vec![0, 2], vec![1, 3]], 4, 0).is_ok());
        let e = validate_groups(&[vec![0, 1], vec![1]], 4, 0).unwrap_err();
        assert!(e.to_string().contains("rank 1 appears more than once"), "{e}");
        let e = validate_groups(&[vec![0, 4]], 4, 2).unwrap_err();
        assert!(e.to_string().contains("names rank 4, but the parent group has 4 ranks"), "{e}");
        assert!(validate_groups(&[vec![]], 4, 0).is_err());
    }

    #[test]
    fn different_group_lists_have_different_fingerprints() {
        assert_ne!(groups_hash(&[vec![0, 1], vec![2, 3]]), groups_hash(&[vec![0, 2], vec![1, 3]]));
        assert_ne!(groups_hash(&[vec![0, 1]]), groups_hash(&[vec![0], vec![1]]));
        assert_eq!(groups_hash(&[vec![0, 1]]), groups_hash(&[vec![0, 1]]));
    }
}
