//! A pipeline's transfers between the pieces of adjacent stages: activations forward,
//! their gradients back, each over the world communicator with a tag both sides derive.

use autopar_comm::Communicator;
use autopar_parallel::pipeline::{Pass, Work};
use autopar_tensor::{DType, Tensor};

use crate::error::{CommPhase, Result, RuntimeError};

/// The message tag of the transfer across piece boundary `boundary` (piece `boundary` to
/// `boundary + 1` forward, back for the gradients) of `work`'s micro-batch: sender and
/// receiver derive the same one. It tells micro-batches, boundaries and passes apart up to
/// 128 micro-batches and 64 boundaries (below MPI's least tag bound, 32767); past that tags
/// repeat, which is safe because both sides take the transfers between a pair of ranks in the
/// same order and messages of one tag arrive in order.
pub(crate) fn transfer_tag(work: Work, boundary: usize) -> u32 {
    let pass = u32::from(work.pass == Pass::Backward);
    ((work.micro as u32).wrapping_mul(64).wrapping_add(boundary as u32 % 64).wrapping_mul(2).wrapping_add(pass)) % 16384
}

fn transfer_err(what: String) -> impl FnOnce(autopar_comm::CommError) -> RuntimeError {
    RuntimeError::comm(CommPhase::PipelineTransfer { what })
}

pub(crate) fn send_tensor(world: &dyn Communicator, t: &Tensor, dest: usize, micro: usize, tag: u32) -> Result<()> {
    let err = || transfer_err(format!("send of micro-batch {micro} to rank {dest}"));
    match t.dtype() {
        DType::F32 => world.send((&t.to_vec::<f32>().expect("f32")).into(), dest, tag).map_err(err()),
        _ => world.send((&t.to_f64_vec()).into(), dest, tag).map_err(err()),
    }
}

pub(crate) fn recv_tensor(
    world: &dyn Communicator,
    shape: &[usize],
    dtype: autopar_graph::DType,
    src: usize,
    micro: usize,
    tag: u32,
) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let err = || transfer_err(format!("receive of micro-batch {micro} from rank {src}"));
    let k = |e| RuntimeError::Kernel { kind: "Recv", name: format!("micro-batch {micro} from rank {src}"), source: Box::new(e) };
    let dt = crate::executor::tensor_dtype(dtype);
    if dt == DType::F32 {
        let mut v = vec![0f32; n];
        world.recv((&mut v).into(), src, tag).map_err(err())?;
        Tensor::from_vec(shape, v).map_err(k)
    } else {
        let mut v = vec![0f64; n];
        world.recv((&mut v).into(), src, tag).map_err(err())?;
        Ok(Tensor::from_vec(shape, v).map_err(k)?.cast(dt))
    }
}

pub(crate) fn all_reduce_tensor(comm: &dyn Communicator, t: &Tensor, name: &str) -> Result<Tensor> {
    let err = RuntimeError::comm(CommPhase::GradientSync { group: comm.world_ranks().to_vec() });
    let k = |e| RuntimeError::Kernel { kind: "AllReduce", name: name.to_string(), source: Box::new(e) };
    if t.dtype() == DType::F32 {
        let mut v = t.to_vec::<f32>().map_err(k)?;
        comm.all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum).map_err(err)?;
        Tensor::from_vec(t.shape(), v).map_err(k)
    } else {
        let mut v = t.to_f64_vec();
        comm.all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum).map_err(err)?;
        Ok(Tensor::from_vec(t.shape(), v).map_err(k)?.cast(t.dtype()))
    }
}
