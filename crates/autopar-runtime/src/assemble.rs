//! Full parameters put back together from the pieces the ranks store (their model-parallel
//! slices, or their optimizer shards of them), only where a user asks for them: from every
//! rank's store in one process ([`assemble_params`]), or sent to rank 0 across processes
//! ([`gather_full_params`], one copy of each distinct piece). One assembler for every job: each
//! parameter comes from the first stage holding it (the only one without a pipeline).

use std::collections::BTreeMap;

use autopar_comm::Communicator;
use autopar_layout::Block;
use autopar_parallel::{ParallelMode, ParamPlan};
use autopar_tensor::Tensor;

use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::ParamStore;
use crate::job::Job;

/// The first stage holding each parameter of `job` (None: no stage uses it; a job without
/// stages holds every parameter on its one stage).
fn first_stages(job: &Job) -> BTreeMap<String, usize> {
    let plan = job.plan();
    plan.param_stages()
        .into_iter()
        .filter_map(|(n, s)| match s.first() {
            Some(&f) => Some((n, f)),
            None if plan.stages == 1 => Some((n, 0)),
            None => None,
        })
        .collect()
}

/// Put every rank's stored pieces back together into full tensors (one owner per distinct
/// piece, on the first stage holding the parameter; hybrid_parallel: rank 0's parameters).
pub fn assemble_params(job: &Job, per_rank: &[ParamStore]) -> Result<ParamStore> {
    assemble_refs(job, &per_rank.iter().collect::<Vec<_>>())
}

/// [`assemble_params`] of stores held elsewhere (by reference: no store is copied).
pub fn assemble_refs(job: &Job, per_rank: &[&ParamStore]) -> Result<ParamStore> {
    if job.mode() == ParallelMode::HybridParallel {
        return Ok(per_rank[0].clone());
    }
    let d = job.plan().stage_devices();
    let first = first_stages(job);
    let mut full = ParamStore::new();
    for p in &job.network().params {
        let Some(&stage) = first.get(&p.name) else { continue };
        full.insert(&p.name, assemble_slices(p, &per_rank[stage * d..(stage + 1) * d])?);
    }
    Ok(full)
}

/// Parameter `p` whole, written from the pieces each of `per_rank`'s ranks (one stage's) stores
/// (its model-parallel slice, or its optimizer shard of it; one owner per distinct piece), in
/// the dtype of the first owner's piece.
fn assemble_slices(p: &ParamPlan, per_rank: &[&ParamStore]) -> Result<Tensor> {
    let name = p.name.as_str();
    let owners = p.stored_owners();
    let shape = p.layout.shape().to_vec();
    let first = per_rank[owners[0]].require(name)?;
    let lay = |e: autopar_layout::LayoutError| {
        RuntimeError::Plan(Box::new(autopar_parallel::ParallelError::Layout { node: name.to_string(), source: e }))
    };
    let mut values = Block::<f64>::zeros(shape.clone());
    for &o in &owners {
        let piece = per_rank[o].require(name)?;
        let piece = Block::new(piece.shape().to_vec(), piece.to_f64_vec()).map_err(lay)?;
        values.write(&p.stored_slice(o).map_err(lay)?, &piece).map_err(lay)?;
    }
    let t = Tensor::from_vec(&shape, values.into_data()).map_err(|e| RuntimeError::Kernel {
        kind: "assemble",
        name: name.to_string(),
        source: Box::new(e),
    })?;
    Ok(t.cast(first.dtype()))
}

/// The full parameters on rank 0, sent to it piece by piece by the ranks storing each
/// distinct piece (one owner per piece), for runs with one rank per process, where no rank sees
/// the others' stores: rank 0 ends with one copy of the model beside its own pieces, the other
/// ranks hold nothing more than theirs. Under hybrid_parallel, whose ranks hold parameters of
/// their own graphs, rank 0's own (as [`assemble_params`] answers). Returns the parameters on
/// rank 0, None on the others. Collective over `world`.
pub fn gather_full_params(job: &Job, world: &dyn Communicator, local: &ParamStore) -> Result<Option<ParamStore>> {
    if job.mode() == ParallelMode::HybridParallel {
        return Ok((world.rank() == 0).then(|| local.clone()));
    }
    let (rank, d) = (world.rank(), job.plan().stage_devices());
    let first = first_stages(job);
    let err = |e| RuntimeError::comm(CommPhase::GatherParameters)(e);
    let mut full = ParamStore::new();
    for p in &job.network().params {
        let Some(&stage) = first.get(&p.name) else { continue };
        let owners: Vec<usize> = p.stored_owners().into_iter().map(|o| stage * d + o).collect();
        if rank != 0 {
            // In plan order, one message per piece this rank owns: rank 0 receives them so.
            if owners.contains(&rank) {
                let mine = local.require(&p.name)?.to_f64_vec();
                world.send((&mine).into(), 0, 0).map_err(err)?;
            }
            continue;
        }
        let shape = p.stored_shape();
        let mut pieces: Vec<ParamStore> = vec![ParamStore::new(); d];
        for &o in &owners {
            let piece = if o == 0 {
                local.require(&p.name)?.clone()
            } else {
                let mut v = vec![0.0f64; shape.iter().product()];
                world.recv((&mut v).into(), o, 0).map_err(err)?;
                let t = Tensor::from_vec(&shape, v).map_err(|e| RuntimeError::Kernel {
                    kind: "Recv",
                    name: p.name.clone(),
                    source: Box::new(e),
                })?;
                t.cast(crate::executor::tensor_dtype(p.dtype))
            };
            pieces[o - stage * d].insert(&p.name, piece);
        }
        full.insert(&p.name, assemble_slices(p, &pieces.iter().collect::<Vec<_>>())?);
    }
    Ok((rank == 0).then_some(full))
}
