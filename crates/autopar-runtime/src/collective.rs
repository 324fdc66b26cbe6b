//! Communication ops of a graph executed through a [`Communicator`].
//!
//! A rank's program names each collective's group by world ranks (sorted ascending, which is the
//! coordinate order along the device axes the planner uses). [`CommGroups`] creates one
//! sub-communicator per group from the program's partitions (every rank creates them in the
//! same order) and [`execute`] turns a tensor into buffers, runs the collective and rearranges
//! the result along the op's dimension: communicators concatenate and split flat buffers in
//! rank order, which is dimension 0.

use std::collections::HashMap;

use autopar_comm::{Buf, BufMut, Communicator, ReduceOp as CommReduce};
use autopar_graph::{CollectiveOp, Node, ReduceOp};
use autopar_tensor::{DType, Tensor};
use half::{bf16, f16};

use crate::error::{CommPhase, Result, RuntimeError};

/// `t` from rank `root` of `comm` (its value on the other ranks is replaced), sent as f32 for f32,
/// f16 and bf16 tensors and as f64 for the others (both exact); `name` appears in errors.
pub(crate) fn broadcast_tensor(comm: &dyn Communicator, t: &Tensor, name: &str, root: usize) -> Result<Tensor> {
    let c = RuntimeError::comm(CommPhase::ParameterBroadcast { name: name.to_string() });
    let k = |e| RuntimeError::Kernel { kind: "Broadcast", name: name.to_string(), source: Box::new(e) };
    let out = match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => {
            let mut v = t.cast(DType::F32).to_vec::<f32>().map_err(k)?;
            comm.broadcast((&mut v).into(), root).map_err(c)?;
            Tensor::from_vec(t.shape(), v).map_err(k)?
        }
        DType::F64 | DType::I32 | DType::I64 => {
            let mut v = t.to_f64_vec();
            comm.broadcast((&mut v).into(), root).map_err(c)?;
            Tensor::from_vec(t.shape(), v).map_err(k)?
        }
    };
    Ok(out.cast(t.dtype()))
}

/// The sub-communicators of one rank, by group (world ranks, ascending).
pub struct CommGroups {
    rank: usize,
    size: usize,
    groups: HashMap<Vec<usize>, Box<dyn Communicator>>,
}

impl std::fmt::Debug for CommGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut keys: Vec<_> = self.groups.keys().collect();
        keys.sort();
        write!(f, "CommGroups {{ rank: {}, size: {}, groups: {keys:?} }}", self.rank, self.size)
    }
}

impl CommGroups {
    /// Split `world` once per partition (a list of disjoint groups of `world`'s ranks covering
    /// every rank), and once more for the group of every rank if no partition is it. Collective: every rank calls it with the same partitions in the same order.
    /// Groups are named by their ranks in `world` (a pipeline stage's communicator: positions
    /// in the stage).
    pub fn create(world: &dyn Communicator, partitions: &[Vec<Vec<usize>>]) -> Result<Self> {
        let rank = world.rank();
        let mut groups = HashMap::new();
        let parent = world.world_ranks();
        for (i, part) in partitions.iter().enumerate() {
            let sub = world.split(part).map_err(RuntimeError::comm(CommPhase::CreateGroups { partition: i }))?;
            if let Some(sub) = sub {
                let mut key: Vec<usize> = sub
                    .world_ranks()
                    .iter()
                    .map(|w| parent.iter().position(|p| p == w).expect("a sub-group's ranks are in its parent"))
                    .collect();
                key.sort_unstable();
                groups.entry(key).or_insert(sub);
            }
        }
        // The group of every rank (the sums of clipping by global norm), unless a partition made it.
        let all: Vec<usize> = (0..world.size()).collect();
        if all.len() > 1 && !groups.contains_key(&all) {
            let whole = world
                .split(std::slice::from_ref(&all))
                .map_err(RuntimeError::comm(CommPhase::CreateGroups { partition: partitions.len() }))?;
            groups.insert(all, whole.expect("every rank is in the group of every rank"));
        }
        Ok(Self { rank, size: world.size(), groups })
    }

    /// The world rank this process runs.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks of the communicator the groups were created from.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The sub-communicator of `group` (world ranks in any order).
    pub fn get(&self, group: &[usize]) -> Result<&dyn Communicator> {
        let mut key = group.to_vec();
        key.sort_unstable();
        self.groups.get(&key).map(|c| c.as_ref()).ok_or_else(|| RuntimeError::MissingGroup { rank: self.rank, group: group.to_vec() })
    }
}

fn comm_op(op: ReduceOp) -> CommReduce {
    match op {
        ReduceOp::Sum => CommReduce::Sum,
        ReduceOp::Mean => CommReduce::Mean,
        ReduceOp::Max => CommReduce::Max,
        ReduceOp::Min => CommReduce::Min,
    }
}

/// A tensor's elements, contiguous and typed for the communicator.
enum Flat {
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

macro_rules! each_flat {
    ($flat:expr, $v:ident => $body:expr) => {
        match $flat {
            Flat::F16($v) => $body,
            Flat::BF16($v) => $body,
            Flat::F32($v) => $body,
            Flat::F64($v) => $body,
            Flat::I32($v) => $body,
            Flat::I64($v) => $body,
        }
    };
}

impl Flat {
    fn of(t: &Tensor) -> Result<Self> {
        let k = |e: autopar_tensor::TensorError| RuntimeError::Kernel { kind: "communication", name: String::new(), source: Box::new(e) };
        Ok(match t.dtype() {
            DType::F16 => Flat::F16(t.to_vec().map_err(k)?),
            DType::BF16 => Flat::BF16(t.to_vec().map_err(k)?),
            DType::F32 => Flat::F32(t.to_vec().map_err(k)?),
            DType::F64 => Flat::F64(t.to_vec().map_err(k)?),
            DType::I32 => Flat::I32(t.to_vec().map_err(k)?),
            DType::I64 => Flat::I64(t.to_vec().map_err(k)?),
        })
    }

    fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F16 => Flat::F16(vec![f16::ZERO; len]),
            DType::BF16 => Flat::BF16(vec![bf16::ZERO; len]),
            DType::F32 => Flat::F32(vec![0.0; len]),
            DType::F64 => Flat::F64(vec![0.0; len]),
            DType::I32 => Flat::I32(vec![0; len]),
            DType::I64 => Flat::I64(vec![0; len]),
        }
    }

    /// The elements read as `[a][b][block]`, written as `[b][a][block]`.
    fn regroup(&self, a: usize, b: usize, block: usize) -> Self {
        fn run<T: Copy>(src: &[T], a: usize, b: usize, block: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(src.len());
            for j in 0..b {
                for i in 0..a {
                    let at = (i * b + j) * block;
                    out.extend_from_slice(&src[at..at + block]);
                }
            }
            out
        }
        match self {
            Flat::F16(v) => Flat::F16(run(v, a, b, block)),
            Flat::BF16(v) => Flat::BF16(run(v, a, b, block)),
            Flat::F32(v) => Flat::F32(run(v, a, b, block)),
            Flat::F64(v) => Flat::F64(run(v, a, b, block)),
            Flat::I32(v) => Flat::I32(run(v, a, b, block)),
            Flat::I64(v) => Flat::I64(run(v, a, b, block)),
        }
    }

    /// `x`'s elements with the `g` equal blocks of axis `dim` brought to the front, as
    /// `concat(split(x, dim, g), 0)` orders them (what a communicator sends in rank order).
    fn blocks_first(x: &Tensor, dim: usize, g: usize) -> Result<Self> {
        let flat = Flat::of(x)?;
        let outer: usize = x.shape()[..dim].iter().product();
        Ok(if outer <= 1 || x.numel() == 0 { flat } else { flat.regroup(outer, g, x.numel() / outer / g) })
    }

    /// The inverse of [`Flat::blocks_first`]: `g` pieces of `piece` shape stacked in rank
    /// order, joined along axis `dim` of the piece.
    fn join_blocks(self, piece: &[usize], dim: usize, g: usize) -> Result<Tensor> {
        let outer: usize = piece[..dim].iter().product();
        let mut shape = piece.to_vec();
        shape[dim] *= g;
        let len: usize = piece.iter().product();
        let joined = if outer <= 1 || len == 0 { self } else { self.regroup(g, outer, len / outer) };
        joined.into_tensor(&shape)
    }

    fn buf(&self) -> Buf<'_> {
        each_flat!(self, v => Buf::from(v))
    }

    fn buf_mut(&mut self) -> BufMut<'_> {
        each_flat!(self, v => BufMut::from(v))
    }

    fn into_tensor(self, shape: &[usize]) -> Result<Tensor> {
        let k = |e: autopar_tensor::TensorError| RuntimeError::Kernel { kind: "communication", name: String::new(), source: Box::new(e) };
        each_flat!(self, v => Tensor::from_vec(shape, v).map_err(k))
    }
}

/// `x`'s elements as a send buffer without a copy, when `x` is row-major contiguous.
fn slice_buf(x: &Tensor) -> Option<Buf<'_>> {
    with_element!(x.dtype(), T => x.as_slice::<T>().map(Buf::from))
}

/// An error unless `x` has an axis `dim` (argument `name` of `op`).
fn check_axis(x: &Tensor, dim: usize, op: &'static str, name: &'static str) -> std::result::Result<(), autopar_tensor::TensorError> {
    if dim >= x.rank() {
        return Err(autopar_tensor::TensorError::InvalidArgument {
            op,
            name,
            value: format!("{dim} for shape {:?}", x.shape()),
            expected: "an axis of the input",
        });
    }
    Ok(())
}

/// An error unless axis `dim` of `x` exists and splits into `g` equal blocks (the shape
/// kernels' own check: their zero-copy split, dropped).
fn check_split(x: &Tensor, dim: usize, g: usize) -> std::result::Result<(), autopar_tensor::TensorError> {
    autopar_tensor::kernels::shape::split(x, dim as isize, g).map(drop)
}

/// Execute communication op `op` (node `name`) on input `x` (the rank's local value);
/// `out_shape` is the inferred local shape of the result. A group of one rank is the identity.
pub fn execute(
    op: CollectiveOp<'_>,
    kind: &'static str,
    name: &str,
    x: &Tensor,
    out_shape: &[usize],
    groups: &CommGroups,
) -> Result<Tensor> {
    let k = |e: autopar_tensor::TensorError| RuntimeError::Kernel { kind, name: name.to_string(), source: Box::new(e) };
    let c = || RuntimeError::comm(CommPhase::Op { kind, name: name.to_string(), rank: groups.rank() });
    let single = match op {
        CollectiveOp::AllReduce(a) => a.group.len() == 1,
        CollectiveOp::AllGather(a) => a.group.len() == 1,
        CollectiveOp::ReduceScatter(a) => a.group.len() == 1,
        CollectiveOp::AllToAll(a) => a.group.len() == 1,
        CollectiveOp::Broadcast(a) => a.group.len() == 1,
        CollectiveOp::Reduce(a) => a.group.len() == 1,
        CollectiveOp::Send(s) => s.peer == groups.rank(),
        CollectiveOp::Recv(r) => r.peer == groups.rank(),
    };
    if single {
        return Ok(x.clone());
    }
    match op {
        CollectiveOp::AllReduce(a) => {
            let comm = groups.get(&a.group)?;
            let mut flat = Flat::of(x)?;
            comm.all_reduce(flat.buf_mut(), comm_op(a.op)).map_err(c())?;
            flat.into_tensor(x.shape())
        }
        CollectiveOp::AllGather(a) => {
            let comm = groups.get(&a.group)?;
            let g = comm.size();
            check_axis(x, a.dim, "all_gather", "dim").map_err(k)?;
            // A row-major input is sent as it is; the stacked pieces are joined along the
            // op's axis (a no-op for the leading one).
            let copy;
            let send = match slice_buf(x) {
                Some(b) => b,
                None => {
                    copy = Flat::of(x)?;
                    copy.buf()
                }
            };
            let mut recv = Flat::zeros(x.dtype(), x.numel() * g);
            comm.all_gather(send, recv.buf_mut()).map_err(c())?;
            recv.join_blocks(x.shape(), a.dim, g)
        }
        CollectiveOp::ReduceScatter(a) => {
            let comm = groups.get(&a.group)?;
            let g = comm.size();
            check_split(x, a.dim, g).map_err(k)?;
            let outer: usize = x.shape()[..a.dim].iter().product();
            let mut recv = Flat::zeros(x.dtype(), x.numel() / g);
            match slice_buf(x).filter(|_| outer == 1) {
                Some(send) => comm.reduce_scatter(send, recv.buf_mut(), comm_op(a.op)),
                None => comm.reduce_scatter(Flat::blocks_first(x, a.dim, g)?.buf(), recv.buf_mut(), comm_op(a.op)),
            }
            .map_err(c())?;
            recv.into_tensor(out_shape)
        }
        CollectiveOp::AllToAll(a) => {
            let comm = groups.get(&a.group)?;
            let g = comm.size();
            check_split(x, a.split_dim, g).map_err(k)?;
            let mut piece = x.shape().to_vec();
            piece[a.split_dim] /= g;
            check_axis(x, a.concat_dim, "all_to_all", "concat_dim").map_err(k)?;
            let send = Flat::blocks_first(x, a.split_dim, g)?;
            let mut recv = Flat::zeros(x.dtype(), x.numel());
            comm.all_to_all(send.buf(), recv.buf_mut()).map_err(c())?;
            recv.join_blocks(&piece, a.concat_dim, g)
        }
        CollectiveOp::Broadcast(b) => {
            let comm = groups.get(&b.group)?;
            let root = comm
                .world_ranks()
                .iter()
                .position(|&w| w == b.root)
                .ok_or_else(|| RuntimeError::MissingGroup { rank: groups.rank(), group: b.group.clone() })?;
            let mut flat = Flat::of(x)?;
            comm.broadcast(flat.buf_mut(), root).map_err(c())?;
            flat.into_tensor(x.shape())
        }
        CollectiveOp::Reduce(r) => {
            // Reduce to the root: every rank computes the reduction, non-roots get zeros
            // (the value only exists on the root, as MindSpore's Reduce).
            let comm = groups.get(&r.group)?;
            let mut flat = Flat::of(x)?;
            comm.all_reduce(flat.buf_mut(), comm_op(r.op)).map_err(c())?;
            if groups.rank() == r.root {
                flat.into_tensor(x.shape())
            } else {
                Ok(Tensor::zeros(x.shape(), x.dtype()))
            }
        }
        CollectiveOp::Send(s) => {
            let comm = groups.get(&[groups.rank().min(s.peer), groups.rank().max(s.peer)])?;
            let peer = comm.world_ranks().iter().position(|&w| w == s.peer).expect("the pair group holds the peer");
            let flat = Flat::of(x)?;
            comm.send(flat.buf(), peer, s.tag).map_err(c())?;
            Ok(x.clone())
        }
        CollectiveOp::Recv(r) => {
            let comm = groups.get(&[groups.rank().min(r.peer), groups.rank().max(r.peer)])?;
            let peer = comm.world_ranks().iter().position(|&w| w == r.peer).expect("the pair group holds the peer");
            let mut flat = Flat::zeros(x.dtype(), out_shape.iter().product());
            comm.recv(flat.buf_mut(), peer, r.tag).map_err(c())?;
            flat.into_tensor(out_shape)
        }
    }
}

/// Execute node `node` (a communication op) on `x`.
pub fn execute_node(node: &Node, x: &Tensor, groups: &CommGroups) -> Result<Tensor> {
    let op = node.op.collective().ok_or_else(|| RuntimeError::NotCommunication { kind: node.op.kind(), name: node.name.clone() })?;
    execute(op, node.op.kind(), &node.name, x, &node.ty.shape, groups)
}

impl crate::executor::Collectives for CommGroups {
    fn execute(&self, node: &Node, input: &Tensor) -> Result<Tensor> {
        execute_node(node, input, self)
    }

    fn all_reduce(&self, node: &Node, group: &[usize], op: ReduceOp, input: &Tensor) -> Result<Tensor> {
        let reduce = autopar_graph::ops::AllReduce { op, group: group.to_vec() };
        execute(CollectiveOp::AllReduce(&reduce), node.op.kind(), &node.name, input, input.shape(), self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_comm::LocalComm;
    use autopar_graph::ops::{AllGather, AllToAll, ReduceScatter};
    use autopar_tensor::kernels::shape as sh;

    /// Rank `r`'s input: distinct values, so a block in the wrong place shows.
    fn input(r: usize) -> Tensor {
        Tensor::from_vec(&[6, 6, 6], (0..216).map(|i| (r * 1000 + i) as f64).collect()).unwrap()
    }

    fn piece(x: &Tensor, dim: usize, g: usize, r: usize) -> Tensor {
        sh::split(x, dim as isize, g).unwrap()[r].clone()
    }

    #[test]
    fn collectives_along_every_axis_join_and_split_the_pieces_in_rank_order() {
        for g in [2usize, 3] {
            let group: Vec<usize> = (0..g).collect();
            LocalComm::run(g, |comm| -> Result<()> {
                let groups = CommGroups::create(&comm, &[vec![group.clone()]])?;
                let r = comm.rank();
                let xs: Vec<Tensor> = (0..g).map(input).collect();
                let refs: Vec<&Tensor> = xs.iter().collect();
                for dim in 0..3 {
                    let gather = AllGather { dim, group: group.clone() };
                    let got = execute(CollectiveOp::AllGather(&gather), "AllGather", "t", &xs[r], &[], &groups)?;
                    let want = sh::concat(&refs, dim as isize).unwrap();
                    assert_eq!((got.shape(), got.to_f64_vec()), (want.shape(), want.to_f64_vec()), "all_gather g {g} dim {dim}");

                    let scatter = ReduceScatter { op: ReduceOp::Sum, dim, group: group.clone() };
                    let want = (0..g)
                        .map(|q| piece(&xs[q], dim, g, r))
                        .reduce(|a, b| autopar_tensor::kernels::elementwise::add(&Default::default(), &a, &b).unwrap())
                        .unwrap();
                    let got = execute(CollectiveOp::ReduceScatter(&scatter), "ReduceScatter", "t", &xs[r], want.shape(), &groups)?;
                    assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "reduce_scatter g {g} dim {dim}");

                    for concat_dim in 0..3 {
                        let a2a = AllToAll { split_dim: dim, concat_dim, group: group.clone() };
                        let pieces: Vec<Tensor> = (0..g).map(|q| piece(&xs[q], dim, g, r)).collect();
                        let want = sh::concat(&pieces.iter().collect::<Vec<_>>(), concat_dim as isize).unwrap();
                        let got = execute(CollectiveOp::AllToAll(&a2a), "AllToAll", "t", &xs[r], want.shape(), &groups)?;
                        assert_eq!(
                            (got.shape(), got.to_f64_vec()),
                            (want.shape(), want.to_f64_vec()),
                            "all_to_all g {g} {dim} -> {concat_dim}"
                        );
                    }
                }
                // Empty tensors (a zero-sized axis before the op's).
                let empty = Tensor::zeros(&[0, 6], DType::F64);
                for dim in 0..2 {
                    let gather = AllGather { dim, group: group.clone() };
                    let got = execute(CollectiveOp::AllGather(&gather), "AllGather", "t", &empty, &[], &groups)?;
                    assert_eq!(got.shape(), if dim == 0 { vec![0, 6] } else { vec![0, 6 * g] }, "all_gather of an empty tensor");
                    let scatter = ReduceScatter { op: ReduceOp::Sum, dim: 1, group: group.clone() };
                    let got = execute(CollectiveOp::ReduceScatter(&scatter), "ReduceScatter", "t", &empty, &[0, 6 / g], &groups)?;
                    assert_eq!(got.numel(), 0);
                    let a2a = AllToAll { split_dim: 1, concat_dim: dim, group: group.clone() };
                    let got = execute(CollectiveOp::AllToAll(&a2a), "AllToAll", "t", &empty, &[], &groups)?;
                    assert_eq!(got.numel(), 0);
                }
                // A strided input (a transposed view) is sent in row-major order.
                let t = sh::transpose(&xs[r], &[1, 0, 2]).unwrap();
                let gather = AllGather { dim: 1, group: group.clone() };
                let got = execute(CollectiveOp::AllGather(&gather), "AllGather", "t", &t, &[], &groups)?;
                let ts: Vec<Tensor> = xs.iter().map(|x| sh::transpose(x, &[1, 0, 2]).unwrap()).collect();
                let want = sh::concat(&ts.iter().collect::<Vec<_>>(), 1).unwrap();
                assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "all_gather of a strided input, g {g}");
                Ok(())
            })
            .unwrap();
        }
    }
}
