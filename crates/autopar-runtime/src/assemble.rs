//! Full parameters put back together from the pieces the ranks store (their model-parallel
//! slices, or their optimizer shards of them): from every rank's store in one process
//! ([`assemble_params`]), or gathered across processes ([`gather_full_params`]). One assembler
//! for every job: each parameter comes from the first stage holding it (the only one without a
//! pipeline).

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
fn assemble_slices(p: &ParamPlan, per_rank: &[ParamStore]) -> Result<Tensor> {
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

/// Every rank's stored pieces gathered so that each rank holds the full parameters (for runs
/// with one rank per process, where no rank sees the others' stores). Every mode but
/// hybrid_parallel, whose ranks' parameters are their own. Collective over `world`.
pub fn gather_full_params(job: &Job, world: &dyn Communicator, local: &ParamStore) -> Result<ParamStore> {
    if job.mode() == ParallelMode::HybridParallel {
        return Err(RuntimeError::HybridGather);
    }
    let plan = job.plan();
    let param_stages = plan.param_stages();
    // What each stage's ranks hold, in plan order: every rank computes the same.
    let holds = |name: &str, stage: usize| plan.stages == 1 || param_stages.iter().any(|(n, s)| n == name && s.contains(&stage));
    let by_stage: Vec<Vec<&ParamPlan>> =
        (0..plan.stages).map(|stage| job.network().params.iter().filter(|p| holds(&p.name, stage)).collect()).collect();
    let held = |r: usize| &by_stage[plan.place(r).0];
    let len = |held: &Vec<&ParamPlan>| -> usize { held.iter().map(|p| p.stored_shape().iter().product::<usize>()).sum() };
    let n = world.size();
    let width = by_stage.iter().map(len).max().unwrap_or(0);
    let mut mine = Vec::with_capacity(width);
    for p in held(world.rank()).iter() {
        mine.extend(local.require(&p.name)?.to_f64_vec());
    }
    mine.resize(width, 0.0);
    let mut all = vec![0.0f64; width * n];
    world.all_gather((&mine).into(), (&mut all).into()).map_err(RuntimeError::comm(CommPhase::GatherParameters))?;
    let mut stores = vec![ParamStore::new(); n];
    for (r, store) in stores.iter_mut().enumerate() {
        let mut at = r * width;
        for p in held(r).iter() {
            let shape = p.stored_shape();
            let count: usize = shape.iter().product();
            let t = Tensor::from_vec(&shape, all[at..at + count].to_vec()).map_err(|e| RuntimeError::Kernel {
                kind: "AllGather",
                name: p.name.clone(),
                source: Box::new(e),
            })?;
            store.insert(&p.name, t.cast(crate::executor::tensor_dtype(p.dtype)));
            at += count;
        }
    }
    assemble_params(job, &stores)
}
