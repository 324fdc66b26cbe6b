//! Parameters moved from one job's layouts to another's, piece by piece, without any full
//! tensor: each rank ends with the pieces the second job gives it, copied from its own store
//! where it already holds them and sent by the ranks storing them otherwise. Used to evaluate
//! a trained job with an inference job planned for another batch size (whose search may split
//! the parameters otherwise).

use std::ops::Range;

use autopar_comm::Communicator;
use autopar_layout::Block;
use autopar_parallel::{ParallelMode, ParamPlan};
use autopar_tensor::Tensor;

use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::ParamStore;
use crate::job::Job;

/// Every global rank storing parameter `p` of `job`, with the piece it stores: the ranks of each
/// stage holding it (every rank without a pipeline).
pub(crate) fn holders(job: &Job, p: &ParamPlan, stages: &[usize]) -> Result<Vec<(usize, Vec<Range<usize>>)>> {
    let d = job.plan().stage_devices();
    let mut out = Vec::new();
    for &s in stages {
        for o in 0..d {
            out.push((s * d + o, p.stored_slice(o).map_err(layout_err(&p.name))?));
        }
    }
    Ok(out)
}

fn layout_err(name: &str) -> impl Fn(autopar_layout::LayoutError) -> RuntimeError + '_ {
    move |e| RuntimeError::Plan(Box::new(autopar_parallel::ParallelError::Layout { node: name.to_string(), source: e }))
}

/// The stages of `job` storing each of its parameters (stage 0 without a pipeline).
pub(crate) fn stages_of(job: &Job, name: &str) -> Vec<usize> {
    let plan = job.plan();
    if plan.stages == 1 {
        return vec![0];
    }
    plan.param_stages().into_iter().find(|(n, _)| n == name).map(|(_, s)| s).unwrap_or_default()
}

/// The overlap of boxes `a` and `b` (None: they do not meet).
fn overlap(a: &[Range<usize>], b: &[Range<usize>]) -> Option<Vec<Range<usize>>> {
    let r: Vec<Range<usize>> = a.iter().zip(b).map(|(x, y)| x.start.max(y.start)..x.end.min(y.end)).collect();
    r.iter().all(|x| x.start < x.end).then_some(r)
}

/// `inner` (a box of the full tensor) relative to `outer`, a box containing it.
fn relative(inner: &[Range<usize>], outer: &[Range<usize>]) -> Vec<Range<usize>> {
    inner.iter().zip(outer).map(|(i, o)| i.start - o.start..i.end - o.start).collect()
}

fn contains(outer: &[Range<usize>], inner: &[Range<usize>]) -> bool {
    outer.iter().zip(inner).all(|(o, i)| o.start <= i.start && i.end <= o.end)
}

/// One copy of a part of a parameter: rank `from` has `region` (a box of the full tensor)
/// inside its stored piece; rank `to` needs it.
#[derive(Clone, Debug, PartialEq)]
struct Copy {
    from: usize,
    to: usize,
    region: Vec<Range<usize>>,
}

/// The copies that give every holder of `to_pieces` its piece from `from_pieces` (the pieces
/// under the first job; the first of equal pieces is the one sent): a rank already storing a
/// part copies it from itself.
fn copies(from_pieces: &[(usize, Vec<Range<usize>>)], to_pieces: &[(usize, Vec<Range<usize>>)]) -> Vec<Copy> {
    // One source per distinct piece: the lowest rank storing it.
    let mut distinct: Vec<&(usize, Vec<Range<usize>>)> = Vec::new();
    for p in from_pieces {
        if !distinct.iter().any(|d| d.1 == p.1) {
            distinct.push(p);
        }
    }
    let mut out = Vec::new();
    for (to, want) in to_pieces {
        let own = from_pieces.iter().find(|(r, _)| r == to).map(|(_, b)| b);
        for (from, have) in &distinct {
            let Some(region) = overlap(have, want) else { continue };
            let from = if own.is_some_and(|b| contains(b, &region)) { *to } else { *from };
            out.push(Copy { from, to: *to, region });
        }
    }
    out
}

/// This rank's parameters under `to`'s layouts, copied from `local`, its store under `from`'s
/// (every rank's pieces together hold each parameter whole). Copies between ranks go one at a time in
/// one order every rank derives from the two plans, so blocking sends cannot wait on each
/// other; no rank holds more than its old and new pieces. Collective over `world` (the job's
/// ranks). Parameters `to` does not have are dropped.
pub fn relayout_params(from: &Job, to: &Job, world: &dyn Communicator, local: &ParamStore) -> Result<ParamStore> {
    if from.mode() == ParallelMode::HybridParallel || to.mode() == ParallelMode::HybridParallel {
        return Err(RuntimeError::Relayout {
            name: String::new(),
            problem: "hybrid_parallel ranks hold parameters of their own graphs, which no plan relates".into(),
        });
    }
    if from.device_num() != to.device_num() {
        return Err(RuntimeError::Relayout {
            name: String::new(),
            problem: format!("one job has {} devices and the other {}", from.device_num(), to.device_num()),
        });
    }
    if world.size() != to.device_num() {
        return Err(RuntimeError::DeviceCount { job: to.device_num(), ranks: world.size() });
    }
    let rank = world.rank();
    let mut out = ParamStore::new();
    for p in &to.network().params {
        let Some(old) = from.network().params.iter().find(|q| q.name == p.name) else {
            return Err(RuntimeError::Relayout {
                name: p.name.clone(),
                problem: "the job the parameters come from has no parameter of that name".into(),
            });
        };
        if old.layout.shape() != p.layout.shape() {
            return Err(RuntimeError::Relayout {
                name: p.name.clone(),
                problem: format!("its shape is {:?} in one job and {:?} in the other", old.layout.shape(), p.layout.shape()),
            });
        }
        let from_pieces = holders(from, old, &stages_of(from, &old.name))?;
        if from_pieces.is_empty() {
            return Err(RuntimeError::Relayout {
                name: p.name.clone(),
                problem: "no stage of the job the parameters come from holds it".into(),
            });
        }
        let to_pieces = holders(to, p, &stages_of(to, &p.name))?;
        let mine_old = from_pieces.iter().find(|(r, _)| *r == rank).map(|(_, b)| b.clone());
        let mine_new = to_pieces.iter().find(|(r, _)| *r == rank).map(|(_, b)| b.clone());
        // The piece is already where it belongs: keep it as it is.
        if mine_old.is_some() && mine_old == mine_new && from_pieces == to_pieces {
            out.insert(&p.name, local.get(&p.name).ok_or_else(|| missing(&p.name, rank))?.clone());
            continue;
        }
        let dtype = crate::executor::tensor_dtype(p.dtype);
        let held = match (&mine_old, local.get(&p.name)) {
            (Some(b), Some(t)) => Some((b, t)),
            (Some(_), None) => return Err(missing(&p.name, rank)),
            (None, _) => None,
        };
        let pieces = Pieces { name: &p.name, held, mine_new: mine_new.as_deref(), from: &from_pieces, to: &to_pieces };
        if let Some(t) = with_element!(dtype, T => move_pieces::<T>(&pieces, world)?) {
            out.insert(&p.name, t);
        }
    }
    Ok(out)
}

/// One parameter's pieces before and after, as [`move_pieces`] takes them.
struct Pieces<'a> {
    name: &'a str,
    /// The rank's piece under the old layout and its values.
    held: Option<(&'a Vec<Range<usize>>, &'a Tensor)>,
    /// The rank's piece under the new layout.
    mine_new: Option<&'a [Range<usize>]>,
    from: &'a [(usize, Vec<Range<usize>>)],
    to: &'a [(usize, Vec<Range<usize>>)],
}

/// The rank's new piece of one parameter (None where it stores none), in the parameter's own
/// element type `T`: copied from its old piece, received from the ranks holding the rest, and
/// sent where other ranks need its values.
fn move_pieces<T>(p: &Pieces<'_>, world: &dyn Communicator) -> Result<Option<Tensor>>
where
    T: autopar_layout::Element + autopar_tensor::Element + autopar_comm::Element,
{
    let rank = world.rank();
    let kernel = |e| RuntimeError::Kernel { kind: "relayout", name: p.name.to_string(), source: Box::new(e) };
    let held = match p.held {
        Some((b, t)) => {
            let own = <T as autopar_tensor::Element>::DTYPE;
            let t = if t.dtype() == own { t.clone() } else { t.cast(own) };
            Some((b, Block::new(t.shape().to_vec(), t.to_vec::<T>().map_err(kernel)?).map_err(layout_err(p.name))?))
        }
        None => None,
    };
    let mut new = p.mine_new.map(|b| Block::<T>::zeros(b.iter().map(|r| r.len()).collect()));
    let err = || RuntimeError::comm(CommPhase::Relayout { name: p.name.to_string() });
    for c in copies(p.from, p.to) {
        if c.from != rank && c.to != rank {
            continue;
        }
        let part = match (&held, c.from == rank) {
            (Some((b, values)), true) => Some(values.slice(&relative(&c.region, b)).map_err(layout_err(p.name))?),
            (None, true) => return Err(missing(p.name, rank)),
            (_, false) => None,
        };
        if c.to != rank {
            let part = part.expect("sent by the rank holding it");
            world.send(part.data().into(), c.to, 0).map_err(err())?;
            continue;
        }
        let part = match part {
            Some(part) => part,
            None => {
                let shape: Vec<usize> = c.region.iter().map(|r| r.len()).collect();
                let mut v = vec![T::default(); shape.iter().product()];
                world.recv((&mut v).into(), c.from, 0).map_err(err())?;
                Block::new(shape, v).map_err(layout_err(p.name))?
            }
        };
        let (Some(block), Some(b)) = (new.as_mut(), p.mine_new) else { continue };
        block.write(&relative(&c.region, b), &part).map_err(layout_err(p.name))?;
    }
    let (Some(block), Some(b)) = (new, p.mine_new) else { return Ok(None) };
    let shape: Vec<usize> = b.iter().map(|r| r.len()).collect();
    Tensor::from_vec(&shape, block.into_data()).map(Some).map_err(kernel)
}

fn missing(name: &str, rank: usize) -> RuntimeError {
    RuntimeError::Relayout { name: name.to_string(), problem: format!("rank {rank} was to store a piece of it but holds none") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(r: &[(usize, usize)]) -> Vec<Range<usize>> {
        r.iter().map(|&(s, e)| s..e).collect()
    }

    #[test]
    fn copies_take_what_a_rank_holds_from_itself_and_the_rest_from_the_first_holder() {
        // Rows split over 2 ranks -> columns split over 2 ranks, of a 4 x 4 tensor.
        let from = vec![(0, b(&[(0, 2), (0, 4)])), (1, b(&[(2, 4), (0, 4)]))];
        let to = vec![(0, b(&[(0, 4), (0, 2)])), (1, b(&[(0, 4), (2, 4)]))];
        let c = copies(&from, &to);
        assert_eq!(
            c,
            vec![
                Copy { from: 0, to: 0, region: b(&[(0, 2), (0, 2)]) },
                Copy { from: 1, to: 0, region: b(&[(2, 4), (0, 2)]) },
                Copy { from: 0, to: 1, region: b(&[(0, 2), (2, 4)]) },
                Copy { from: 1, to: 1, region: b(&[(2, 4), (2, 4)]) },
            ]
        );
        // Replicated on both ranks -> split: every part is the rank's own.
        let whole = vec![(0, b(&[(0, 4), (0, 4)])), (1, b(&[(0, 4), (0, 4)]))];
        assert!(copies(&whole, &to).iter().all(|c| c.from == c.to));
        // Split -> replicated: each rank gets the other's half.
        let c = copies(&from, &whole);
        assert_eq!(c.iter().filter(|c| c.from != c.to).count(), 2);
    }
}
