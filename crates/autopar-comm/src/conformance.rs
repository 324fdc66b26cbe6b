//! The backend conformance suite: every collective, every element type, odd sizes and
//! sub-groups, checked against the serial reference ([`crate::reduce_serial`], concatenation,
//! block transposition).
//!
//! Every rank can compute every other rank's input (inputs are a hash of rank, index and a
//! salt), so each rank checks its own result without extra communication. Inputs are
//! multiples of 1/8 (and for products a few small values), so sums and products are exact in
//! every element type's accumulator and those checks hold for any reduction order. Then sums and
//! means of arbitrary values (any exponent, rounding at every step) check the stronger promise
//! every backend keeps: the bits of the rank-order fold [`reduce_serial`], so a run gives the
//! same numbers on [`crate::LocalComm`] and under `mpirun` on `MpiComm`.

use half::{bf16, f16};

use autopar_layout::DeviceMatrix;

use crate::comm::Communicator;
use crate::dtype::{reduce_serial, Buf, BufMut, DType, Element, ReduceOp};
use crate::error::{CommError, Result};

/// Odd and awkward lengths: one element, fewer elements than ranks, not a multiple of the cache
/// line, more than one reduction piece.
pub const LENGTHS: [usize; 4] = [1, 3, 37, 2053];

trait Sample: Element {
    /// k / 8 for floats, k for integers.
    fn from_k(k: i64) -> Self;
    /// An arbitrary value from a hash: for floats any sign, mantissa and an exponent in
    /// [-8, 8], so sums round and their order shows in the bits.
    fn rough(h: u64) -> Self {
        Self::from_k((h % 1_000_003) as i64 - 500_001)
    }
}

macro_rules! float_sample {
    ($t:ty, $conv:expr) => {
        impl Sample for $t {
            fn from_k(k: i64) -> Self {
                $conv(k as f64 / 8.0)
            }
            fn rough(h: u64) -> Self {
                let unit = (h >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                $conv(unit * f64::powi(2.0, (h % 17) as i32 - 8))
            }
        }
    };
}
float_sample!(f32, |x: f64| x as f32);
float_sample!(f64, |x: f64| x);
float_sample!(f16, f16::from_f64);
float_sample!(bf16, bf16::from_f64);
impl Sample for i32 {
    fn from_k(k: i64) -> Self {
        k as i32
    }
}
impl Sample for i64 {
    fn from_k(k: i64) -> Self {
        k
    }
}

fn mix(salt: u64, rank: usize, i: usize) -> u64 {
    let mut z = salt ^ ((rank as u64) << 40) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The input of `rank` at index `i` for a test with `salt`; small values for products.
fn input<T: Sample>(salt: u64, rank: usize, i: usize, op: ReduceOp) -> T {
    let h = mix(salt, rank, i);
    if op == ReduceOp::Prod {
        // Products of up to 8 of {1/2, 1, 3/2, 2, -1} (or {1, 2, 3, -1}) are exact.
        const FLOAT: [i64; 5] = [4, 8, 12, 16, -8];
        const INT: [i64; 4] = [1, 2, 3, -1];
        return if matches!(T::DTYPE, DType::I32 | DType::I64) {
            T::from_k(INT[(h % 4) as usize])
        } else {
            T::from_k(FLOAT[(h % 5) as usize])
        };
    }
    T::from_k((h % 257) as i64 - 128)
}

fn inputs<T: Sample>(salt: u64, rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    (0..len).map(|i| input(salt, rank, i, op)).collect()
}

struct Ctx<'a> {
    comm: &'a dyn Communicator,
    checks: usize,
    salt: u64,
}

impl Ctx<'_> {
    fn next_salt(&mut self) -> u64 {
        self.salt = self.salt.wrapping_add(0x632b_e59b_d9b4_e019);
        self.salt
    }

    /// `got` must equal `want` element by element.
    fn expect<T: Element>(&mut self, check: impl FnOnce() -> String, got: &[T], want: &[T]) -> Result<()> {
        self.expect_where(check, got, want, |i| got[i] == want[i])
    }

    /// As [`Ctx::expect`], comparing the bytes (so -0.0 is not 0.0 and NaNs must match).
    fn expect_bits<T: Element>(&mut self, check: impl FnOnce() -> String, got: &[T], want: &[T]) -> Result<()> {
        let es = T::DTYPE.size();
        let (g, w) = (Buf::from(got).as_bytes(), Buf::from(want).as_bytes());
        self.expect_where(check, got, want, |i| g[i * es..(i + 1) * es] == w[i * es..(i + 1) * es])
    }

    fn expect_where<T: Element>(
        &mut self,
        check: impl FnOnce() -> String,
        got: &[T],
        want: &[T],
        same: impl Fn(usize) -> bool,
    ) -> Result<()> {
        if let Some(i) = (0..want.len()).find(|&i| !same(i)) {
            return Err(CommError::Conformance {
                rank: self.comm.world_ranks()[self.comm.rank()],
                check: check(),
                detail: format!("element {i} of {}: got {:?}, expected {:?}", want.len(), got[i], want[i]),
            });
        }
        self.checks += 1;
        Ok(())
    }
}

fn suite_typed<T: Sample>(cx: &mut Ctx<'_>) -> Result<()> {
    suite_reductions::<T>(cx)?;
    suite_parts::<T>(cx)?;
    suite_moves::<T>(cx)
}

/// all_reduce and reduce_scatter of every op, then of arbitrary values (the rank-order bits).
fn suite_reductions<T: Sample>(cx: &mut Ctx<'_>) -> Result<()> {
    let comm = cx.comm;
    let (n, me) = (comm.size(), comm.rank());
    let dt = T::DTYPE;
    // all_reduce
    for op in ReduceOp::ALL {
        for len in LENGTHS {
            let salt = cx.next_salt();
            let mut buf: Vec<T> = inputs(salt, me, len, op);
            comm.all_reduce((&mut buf).into(), op)?;
            let want: Vec<T> =
                (0..len).map(|i| reduce_serial(&(0..n).map(|r| input::<T>(salt, r, i, op)).collect::<Vec<_>>(), op)).collect();
            cx.expect(|| format!("all_reduce {op} {dt} x {len} on {n} ranks"), &buf, &want)?;
        }
    }
    // reduce_scatter
    for op in ReduceOp::ALL {
        for block in [1, 3, 37] {
            let salt = cx.next_salt();
            let send: Vec<T> = inputs(salt, me, block * n, op);
            let mut recv = vec![T::from_k(0); block];
            comm.reduce_scatter((&send).into(), (&mut recv).into(), op)?;
            let want: Vec<T> = (0..block)
                .map(|i| reduce_serial(&(0..n).map(|r| input::<T>(salt, r, me * block + i, op)).collect::<Vec<_>>(), op))
                .collect();
            cx.expect(|| format!("reduce_scatter {op} {dt} block {block} on {n} ranks"), &recv, &want)?;
        }
    }
    // Arbitrary values: every backend gives the rank-order fold's bits.
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        for len in LENGTHS {
            let salt = cx.next_salt();
            let rough = |r: usize, i: usize| T::rough(mix(salt, r, i));
            let mut buf: Vec<T> = (0..len).map(|i| rough(me, i)).collect();
            comm.all_reduce((&mut buf).into(), op)?;
            let want: Vec<T> = (0..len).map(|i| reduce_serial(&(0..n).map(|r| rough(r, i)).collect::<Vec<_>>(), op)).collect();
            cx.expect_bits(|| format!("all_reduce {op} {dt} x {len} of arbitrary values on {n} ranks (rank-order bits)"), &buf, &want)?;
        }
        let block = 37;
        let salt = cx.next_salt();
        let rough = |r: usize, i: usize| T::rough(mix(salt, r, i));
        let send: Vec<T> = (0..block * n).map(|i| rough(me, i)).collect();
        let mut recv = vec![T::from_k(0); block];
        comm.reduce_scatter((&send).into(), (&mut recv).into(), op)?;
        let want: Vec<T> = (0..block).map(|i| reduce_serial(&(0..n).map(|r| rough(r, me * block + i)).collect::<Vec<_>>(), op)).collect();
        cx.expect_bits(
            || format!("reduce_scatter {op} {dt} block {block} of arbitrary values on {n} ranks (rank-order bits)"),
            &recv,
            &want,
        )?;
    }
    Ok(())
}

/// The fused collectives of parts: the bits of one collective of the packed parts.
fn suite_parts<T: Sample>(cx: &mut Ctx<'_>) -> Result<()> {
    let comm = cx.comm;
    let (n, me) = (comm.size(), comm.rank());
    let dt = T::DTYPE;
    // all_reduce_parts: the bits of one all_reduce of the concatenation, parts of odd lengths
    // (an empty one among them) straddling the ranks' chunks.
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        let lens = [37usize, 0, 1, 2053, 3];
        let salt = cx.next_salt();
        let rough = |r: usize, i: usize| T::rough(mix(salt, r, i));
        let total: usize = lens.iter().sum();
        let mut mine: Vec<T> = (0..total).map(|i| rough(me, i)).collect();
        {
            let mut rest = mine.as_mut_slice();
            let mut parts = Vec::new();
            for &l in &lens {
                let (part, tail) = rest.split_at_mut(l);
                parts.push(BufMut::from(part));
                rest = tail;
            }
            comm.all_reduce_parts(&mut parts, op)?;
        }
        let want: Vec<T> = (0..total).map(|i| reduce_serial(&(0..n).map(|r| rough(r, i)).collect::<Vec<_>>(), op)).collect();
        cx.expect_bits(|| format!("all_reduce_parts {op} {dt} parts {lens:?} on {n} ranks (rank-order bits)"), &mine, &want)?;
    }
    // all_gather_parts / reduce_scatter_parts: the bits of one all_gather / reduce_scatter of
    // the packed parts (odd lengths, an empty one among them).
    let lens = [37usize, 0, 1, 2053, 3];
    {
        let salt = cx.next_salt();
        let value = |r: usize, p: usize, i: usize| T::rough(mix(salt, r, p * 4096 + i));
        let send: Vec<Vec<T>> = lens.iter().enumerate().map(|(p, &l)| (0..l).map(|i| value(me, p, i)).collect()).collect();
        let mut recv: Vec<Vec<T>> = lens.iter().map(|&l| vec![T::from_k(0); l * n]).collect();
        {
            let send: Vec<Buf<'_>> = send.iter().map(|v| T::buf(v)).collect();
            let mut recv: Vec<BufMut<'_>> = recv.iter_mut().map(|v| T::buf_mut(v)).collect();
            comm.all_gather_parts(&send, &mut recv)?;
        }
        for (p, &l) in lens.iter().enumerate() {
            let want: Vec<T> = (0..n).flat_map(|r| (0..l).map(move |i| value(r, p, i))).collect();
            cx.expect_bits(|| format!("all_gather_parts {dt} part {p} of {lens:?} on {n} ranks"), &recv[p], &want)?;
        }
    }
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        let salt = cx.next_salt();
        let value = |r: usize, p: usize, i: usize| T::rough(mix(salt, r, p * 65536 + i));
        let send: Vec<Vec<T>> = lens.iter().enumerate().map(|(p, &l)| (0..l * n).map(|i| value(me, p, i)).collect()).collect();
        let mut recv: Vec<Vec<T>> = lens.iter().map(|&l| vec![T::from_k(0); l]).collect();
        {
            let send: Vec<Buf<'_>> = send.iter().map(|v| T::buf(v)).collect();
            let mut recv: Vec<BufMut<'_>> = recv.iter_mut().map(|v| T::buf_mut(v)).collect();
            comm.reduce_scatter_parts(&send, &mut recv, op)?;
        }
        for (p, &l) in lens.iter().enumerate() {
            let want: Vec<T> = (0..l).map(|i| reduce_serial(&(0..n).map(|r| value(r, p, me * l + i)).collect::<Vec<_>>(), op)).collect();
            cx.expect_bits(
                || format!("reduce_scatter_parts {op} {dt} part {p} of {lens:?} on {n} ranks (rank-order bits)"),
                &recv[p],
                &want,
            )?;
        }
    }
    Ok(())
}

/// all_gather, broadcast from every root, all_to_all, send/recv.
fn suite_moves<T: Sample>(cx: &mut Ctx<'_>) -> Result<()> {
    let comm = cx.comm;
    let (n, me) = (comm.size(), comm.rank());
    let dt = T::DTYPE;
    // all_gather
    for len in [1, 3, 37] {
        let salt = cx.next_salt();
        let send: Vec<T> = inputs(salt, me, len, ReduceOp::Sum);
        let mut recv = vec![T::from_k(0); len * n];
        comm.all_gather((&send).into(), (&mut recv).into())?;
        let want: Vec<T> = (0..n).flat_map(|r| inputs::<T>(salt, r, len, ReduceOp::Sum)).collect();
        cx.expect(|| format!("all_gather {dt} x {len} on {n} ranks"), &recv, &want)?;
    }
    // broadcast from every root
    for root in 0..n {
        for len in [1, 37] {
            let salt = cx.next_salt();
            let mut buf: Vec<T> = inputs(salt, me, len, ReduceOp::Sum);
            comm.broadcast((&mut buf).into(), root)?;
            let want: Vec<T> = inputs(salt, root, len, ReduceOp::Sum);
            cx.expect(|| format!("broadcast {dt} x {len} from root {root} on {n} ranks"), &buf, &want)?;
        }
    }
    // all_to_all
    for block in [1, 5] {
        let salt = cx.next_salt();
        let send: Vec<T> = inputs(salt, me, block * n, ReduceOp::Sum);
        let mut recv = vec![T::from_k(0); block * n];
        comm.all_to_all((&send).into(), (&mut recv).into())?;
        let want: Vec<T> = (0..n).flat_map(|src| (0..block).map(move |i| input::<T>(salt, src, me * block + i, ReduceOp::Sum))).collect();
        cx.expect(|| format!("all_to_all {dt} block {block} on {n} ranks"), &recv, &want)?;
    }
    // send/recv around a ring, two tags received in the opposite order of sending
    if n > 1 {
        let salt = cx.next_salt();
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let a: Vec<T> = inputs(salt, me, 5, ReduceOp::Sum);
        let b: Vec<T> = inputs(salt ^ 1, me, 3, ReduceOp::Sum);
        comm.send((&a).into(), next, 1)?;
        comm.send((&b).into(), next, 2)?;
        let mut rb = vec![T::from_k(0); 3];
        let mut ra = vec![T::from_k(0); 5];
        comm.recv((&mut rb).into(), prev, 2)?;
        comm.recv((&mut ra).into(), prev, 1)?;
        cx.expect(|| format!("send/recv {dt} tag 1 from rank {prev}"), &ra, &inputs::<T>(salt, prev, 5, ReduceOp::Sum))?;
        cx.expect(|| format!("send/recv {dt} tag 2 from rank {prev}"), &rb, &inputs::<T>(salt ^ 1, prev, 3, ReduceOp::Sum))?;
        comm.barrier()?;
    }
    Ok(())
}

/// Sub-groups: the groups of a device matrix along each axis, a reversed group (rank order
/// follows the list), and a split leaving rank 0 out.
fn suite_groups(cx: &mut Ctx<'_>) -> Result<()> {
    let comm = cx.comm;
    let (n, me) = (comm.size(), comm.rank());
    let mut lists: Vec<Vec<Vec<usize>>> = Vec::new();
    let dims: Vec<usize> = match n {
        4 => vec![2, 2],
        6 => vec![2, 3],
        8 => vec![2, 4],
        _ => vec![n],
    };
    let mesh = DeviceMatrix::new(dims.clone()).map_err(|e| CommError::Conformance {
        rank: comm.world_ranks()[me],
        check: "device matrix for groups".into(),
        detail: e.to_string(),
    })?;
    for axis in 0..dims.len() {
        lists.push(mesh.groups_along(&[axis]).expect("axis in range"));
    }
    lists.push(vec![(0..n).rev().collect()]);
    if n > 1 {
        lists.push(vec![(1..n).collect()]);
    }
    for groups in lists {
        let sub = comm.split(&groups)?;
        let Some(sub) = sub else {
            if groups.iter().any(|g| g.contains(&me)) {
                return Err(CommError::Conformance {
                    rank: comm.world_ranks()[me],
                    check: format!("split {groups:?}"),
                    detail: "listed rank got no sub-group".into(),
                });
            }
            cx.checks += 1;
            continue;
        };
        let g = groups.iter().find(|g| g.contains(&me)).expect("listed");
        let pos = g.iter().position(|&r| r == me).expect("member");
        let want_world: Vec<usize> = g.iter().map(|&r| comm.world_ranks()[r]).collect();
        if sub.rank() != pos || sub.size() != g.len() || sub.world_ranks() != want_world {
            return Err(CommError::Conformance {
                rank: comm.world_ranks()[me],
                check: format!("split {groups:?}"),
                detail: format!(
                    "got rank {} of {} with world ranks {:?}, expected rank {pos} of {} with {:?}",
                    sub.rank(),
                    sub.size(),
                    sub.world_ranks(),
                    g.len(),
                    want_world
                ),
            });
        }
        let salt = cx.next_salt();
        for len in [1, 37] {
            let mut buf: Vec<f32> = inputs(salt, me, len, ReduceOp::Sum);
            sub.all_reduce((&mut buf).into(), ReduceOp::Sum)?;
            let want: Vec<f32> = (0..len)
                .map(|i| reduce_serial(&g.iter().map(|&r| input::<f32>(salt, r, i, ReduceOp::Sum)).collect::<Vec<_>>(), ReduceOp::Sum))
                .collect();
            cx.expect(|| format!("all_reduce in sub-group {g:?} of {groups:?}"), &buf, &want)?;
            let send: Vec<i64> = inputs(salt, me, len, ReduceOp::Sum);
            let mut recv = vec![0i64; len * g.len()];
            sub.all_gather((&send).into(), (&mut recv).into())?;
            let want: Vec<i64> = g.iter().flat_map(|&r| inputs::<i64>(salt, r, len, ReduceOp::Sum)).collect();
            cx.expect(|| format!("all_gather in sub-group {g:?}"), &recv, &want)?;
        }
        if sub.size() > 1 {
            // A point-to-point pair inside the sub-group uses sub-group ranks.
            let salt = cx.next_salt();
            let (next, prev) = ((pos + 1) % g.len(), (pos + g.len() - 1) % g.len());
            sub.send((&inputs::<bf16>(salt, me, 4, ReduceOp::Sum)).into(), next, 7)?;
            let mut got = vec![bf16::ZERO; 4];
            sub.recv((&mut got).into(), prev, 7)?;
            cx.expect(|| format!("send/recv in sub-group {g:?}"), &got, &inputs::<bf16>(salt, g[prev], 4, ReduceOp::Sum))?;
        }
        // Nested split: halve the sub-group.
        let half = sub.size().div_ceil(2);
        let mut halves: Vec<Vec<usize>> = vec![(0..half).collect()];
        if half < sub.size() {
            halves.push((half..sub.size()).collect());
        }
        let nested = sub.split(&halves)?.expect("every rank listed");
        let mut one = vec![1i32];
        nested.all_reduce((&mut one).into(), ReduceOp::Sum)?;
        let want = if sub.rank() < half { half } else { sub.size() - half } as i32;
        cx.expect(|| format!("nested split of {g:?}"), &one, &[want])?;
    }
    Ok(())
}

/// One all-reduce and one reduce-scatter of arbitrary f32 values larger than a backend's
/// working segment (MpiComm reduces 16 MiB at a time): the same rank-order bits across the
/// segment boundaries.
fn suite_large(cx: &mut Ctx<'_>) -> Result<()> {
    let comm = cx.comm;
    let (n, me) = (comm.size(), comm.rank());
    if !matches!(n, 2 | 3 | 4 | 8) {
        // Even and uneven chunks are covered by these; every rank count costs seconds.
        return Ok(());
    }
    let len = (18 << 20) / 4 + 3;
    let salt = cx.next_salt();
    let rough = |r: usize, i: usize| f32::rough(mix(salt, r, i));
    // Checked: every 61st element, both sides of the 16 MiB boundary, and the tail.
    let boundary: usize = (16 << 20) / 4;
    let picks = |len: usize| -> Vec<usize> {
        let mut v: Vec<usize> =
            (0..len).step_by(61).chain(boundary.saturating_sub(64)..(boundary + 64).min(len)).chain(len.saturating_sub(64)..len).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let serial = |op: ReduceOp, at: &dyn Fn(usize) -> usize, i: usize| {
        let values: Vec<f32> = (0..n).map(|r| rough(r, at(i))).collect();
        reduce_serial(&values, op)
    };
    let mut buf: Vec<f32> = (0..len).map(|i| rough(me, i)).collect();
    comm.all_reduce((&mut buf).into(), ReduceOp::Sum)?;
    let at = picks(len);
    let got: Vec<f32> = at.iter().map(|&i| buf[i]).collect();
    let want: Vec<f32> = at.iter().map(|&i| serial(ReduceOp::Sum, &|i| i, i)).collect();
    cx.expect_bits(|| format!("all_reduce sum f32 x {len} (18 MiB) on {n} ranks"), &got, &want)?;
    let block = len / n;
    let send: Vec<f32> = (0..block * n).map(|i| rough(me, i)).collect();
    let mut recv = vec![0f32; block];
    comm.reduce_scatter((&send).into(), (&mut recv).into(), ReduceOp::Mean)?;
    let at = picks(block);
    let got: Vec<f32> = at.iter().map(|&i| recv[i]).collect();
    let want: Vec<f32> = at.iter().map(|&i| serial(ReduceOp::Mean, &|i| me * block + i, i)).collect();
    cx.expect_bits(|| format!("reduce_scatter mean f32 block {block} on {n} ranks"), &got, &want)
}

/// Run the whole suite on `comm` (every rank of it must call this). Returns the number of
/// checks that passed on this rank; the first wrong result is a [`CommError::Conformance`].
pub fn run_suite(comm: &dyn Communicator) -> Result<usize> {
    let mut cx = Ctx { comm, checks: 0, salt: 0x5eed };
    for dt in DType::ALL {
        match dt {
            DType::F16 => suite_typed::<f16>(&mut cx)?,
            DType::BF16 => suite_typed::<bf16>(&mut cx)?,
            DType::F32 => suite_typed::<f32>(&mut cx)?,
            DType::F64 => suite_typed::<f64>(&mut cx)?,
            DType::I32 => suite_typed::<i32>(&mut cx)?,
            DType::I64 => suite_typed::<i64>(&mut cx)?,
        }
    }
    // Before the sub-groups: ranks left out of a group skip its salts, so salts agree up to there.
    suite_large(&mut cx)?;
    suite_groups(&mut cx)?;
    comm.barrier()?;
    Ok(cx.checks)
}
