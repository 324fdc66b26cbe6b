//! [`MpiComm`]: one rank per process over MPI (OpenMPI 4.1 through the `mpi` crate).
//!
//! * Rank and size come from MPI; sub-groups are `MPI_Comm_split` of the parent (color = index
//!   of the group, key = position in it). Ranks first check with one small all-reduce that they
//!   all passed the same group lists.
//! * Collectives call MPI directly on the caller's buffers. Reductions give
//!   [`crate::LocalComm`]'s bits for any input: rank j receives every rank's copy of chunk j
//!   (`MPI_Alltoallv`), folds them in rank order with the kernel `LocalComm` uses (f16 and bf16
//!   in f32, rounded once) and the chunks go back to all (`MPI_Allgatherv`, in place through
//!   `MPI_IN_PLACE`, exported by a small C shim because its value differs between MPI
//!   implementations). That is a ring all-reduce's traffic, and a run resumed across backends
//!   continues bit for bit.
//! * Failures end the job: MPI's default error handler aborts on any MPI error (with MPI's
//!   message), and [`MpiComm::run`] turns an error or panic of the rank's work into
//!   `autopar[rank]: message` on stderr and `MPI_Abort`, which stops every process of the job.
//! * MPI is initialized requesting `MPI_THREAD_MULTIPLE`, so communicators may be used from any
//!   thread (one call at a time per communicator: `MpiComm` is `Send`, not `Sync`).

use std::cell::RefCell;
use std::fmt;
use std::ops::Range;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::Communicator as _;

use crate::comm::{groups_hash, validate_groups, Check, Communicator};
use crate::dtype::{Buf, BufMut, DType, ReduceOp};
use crate::error::{CommError, Result};
use crate::fold::fold;

extern "C" {
    fn autopar_mpi_in_place() -> *mut c_void;
}

struct Env {
    _universe: mpi::environment::Universe,
    threading: mpi::Threading,
}

/// One rank of an MPI job (or of a sub-group of it).
pub struct MpiComm {
    // Field order matters: the communicator is freed before the environment is finalized.
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    world_ranks: Vec<usize>,
    env: Arc<Env>,
    /// Every rank's copy of this rank's chunk during a reduction, kept between calls so that a
    /// step's gradient all-reduces do not allocate (and page-fault) a fresh buffer each.
    scratch: RefCell<Vec<u8>>,
}

// SAFETY: MPI is initialized with MPI_THREAD_MULTIPLE (see `threading`); an MpiComm is used by
// one thread at a time (it is not Sync).
unsafe impl Send for MpiComm {}

impl fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiComm").field("rank", &self.rank).field("size", &self.size).field("world_ranks", &self.world_ranks).finish()
    }
}

fn mpi_err(what: impl Into<String>) -> CommError {
    CommError::Mpi { what: what.into(), hint: "run under mpirun (or autopar launch) with OpenMPI installed" }
}

fn datatype(d: DType) -> ffi::MPI_Datatype {
    // SAFETY: reading MPI's predefined handles exported by the mpi-sys shim.
    unsafe {
        match d {
            DType::F16 | DType::BF16 => ffi::RSMPI_UINT16_T,
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
        }
    }
}

/// Reductions work on segments of at most this many bytes, so the scratch buffer that holds
/// every rank's copy of a chunk stays this small whatever the buffer's size.
const SEGMENT_BYTES: usize = 16 << 20;

/// Chunk `i` of `len` elements over `n` ranks.
fn chunk(len: usize, n: usize, i: usize) -> Range<usize> {
    let per = len.div_ceil(n);
    let start = (i * per).min(len);
    start..(start + per).min(len)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

/// Print `autopar[rank]: message` and end the whole MPI job.
pub fn abort_job(world_rank: usize, message: &str) -> ! {
    use std::fmt::Write as _;
    use std::io::Write as _;
    let mut lines = message.lines();
    // One write of the whole text: stderr is unbuffered, and mpirun's own abort message must
    // not land inside the rank's line.
    let mut text = format!("autopar[{world_rank}]: {}\n", lines.next().unwrap_or("failed"));
    for l in lines {
        let l = l.trim_start();
        let _ = if l.starts_with("hint:") { writeln!(text, "{l}") } else { writeln!(text, "  {l}") };
    }
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
    drop(err);
    // SAFETY: MPI is initialized (an MpiComm existed); MPI_Abort does not return in OpenMPI.
    unsafe {
        ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1);
    }
    std::process::abort()
}

impl MpiComm {
    /// Initialize MPI and return the world communicator. Once per process.
    pub fn init() -> Result<MpiComm> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| mpi_err("MPI is already initialized in this process (MpiComm::init may be called once)"))?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Ok(MpiComm {
            comm: world,
            rank,
            size,
            world_ranks: (0..size).collect(),
            env: Arc::new(Env { _universe: universe, threading }),
            scratch: RefCell::default(),
        })
    }

    /// Initialize MPI, run `f` on this process's rank and return its result. When `f` returns
    /// an error or panics, print `autopar[rank]: message` and abort the whole job (every rank
    /// exits non-zero; nobody waits forever on the failed rank).
    pub fn run<R, E, F>(f: F) -> Result<R>
    where
        E: fmt::Display,
        F: FnOnce(MpiComm) -> std::result::Result<R, E>,
    {
        let comm = Self::init()?;
        let world_rank = comm.world_ranks[comm.rank];
        let env = comm.env.clone();
        let out = catch_unwind(AssertUnwindSafe(|| f(comm)));
        match out {
            Ok(Ok(v)) => {
                drop(env);
                Ok(v)
            }
            Ok(Err(e)) => abort_job(world_rank, &format!("{e:#}")),
            Err(p) => abort_job(world_rank, &panic_message(p.as_ref())),
        }
    }

    /// End the whole job with this rank's message.
    pub fn abort(&self, message: &str) -> ! {
        abort_job(self.world_ranks[self.rank], message)
    }

    /// The thread support level MPI granted.
    pub fn threading(&self) -> mpi::Threading {
        self.env.threading
    }

    /// The underlying rsmpi communicator, for code that needs MPI directly (benchmarks).
    pub fn raw(&self) -> &SimpleCommunicator {
        &self.comm
    }

    fn world_rank(&self) -> usize {
        self.world_ranks[self.rank]
    }

    fn check(&self, op: &'static str) -> Check<'_> {
        Check { op, rank: self.world_rank(), size: self.size, _world: &self.world_ranks }
    }

    fn count(&self, op: &'static str, len: usize) -> Result<c_int> {
        c_int::try_from(len).map_err(|_| CommError::TooLarge { op, rank: self.world_rank(), len, max: c_int::MAX as usize })
    }

    /// The scratch buffer, at least `bytes` long (and never empty: an empty `Vec<u8>`'s
    /// dangling pointer is 0x1, which is OpenMPI's `MPI_IN_PLACE`).
    fn scratch(&self, bytes: usize) -> std::cell::RefMut<'_, Vec<u8>> {
        let mut s = self.scratch.borrow_mut();
        if s.len() < bytes.max(1) {
            s.resize(bytes.max(1), 0);
        }
        s
    }

    /// All-reduce of `len` elements of `dtype` at `ptr`: rank j owns chunk j; every rank's
    /// copy of it comes to j (all-to-all), j folds them in rank order, and the folded chunks
    /// go to everyone (all-gather): a ring all-reduce's traffic, and LocalComm's bits.
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` elements of `dtype`, and every rank calls
    /// this with the same `len`.
    unsafe fn all_reduce_segment(&self, ptr: *mut u8, len: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let n = self.size;
        let chunks: Vec<Range<usize>> = (0..n).map(|j| chunk(len, n, j)).collect();
        let counts: Vec<c_int> = chunks.iter().map(|r| r.len() as c_int).collect();
        let displs: Vec<c_int> = chunks.iter().map(|r| r.start as c_int).collect();
        let mine = chunks[self.rank].clone();
        // SAFETY: counts and displacements lie within the segment (len elements); every rank
        // computes the same chunks; this rank's chunk of the segment is the destination.
        unsafe { self.fold_copies("all_reduce", ptr, &counts, &displs, mine.len(), dtype, op, ptr.add(mine.start * dtype.size()))? };
        let dt = datatype(dtype);
        // SAFETY: in place: this rank's chunk is already at its displacement in the segment.
        let rc = unsafe {
            ffi::MPI_Allgatherv(autopar_mpi_in_place(), 0, dt, ptr as *mut c_void, counts.as_ptr(), displs.as_ptr(), dt, self.comm.as_raw())
        };
        self.rc("all_reduce", rc)
    }

    /// Sends `counts[j]` elements at `displs[j]` of `send` to rank j and receives `m` elements
    /// from every rank (all-to-all into the scratch buffer), then folds the n copies in rank
    /// order into `dst`: the step every reduction shares.
    ///
    /// # Safety
    /// `send` is valid for every `displs[j] + counts[j]` elements of `dtype`, every rank sends
    /// this rank `m` elements, and `dst` is valid for writes of `m` elements that nothing else
    /// touches meanwhile (it may lie within `send`: the all-to-all completes before the fold).
    #[allow(clippy::too_many_arguments)]
    unsafe fn fold_copies(
        &self,
        op_name: &'static str,
        send: *const u8,
        counts: &[c_int],
        displs: &[c_int],
        m: usize,
        dtype: DType,
        op: ReduceOp,
        dst: *mut u8,
    ) -> Result<()> {
        let (n, es) = (self.size, dtype.size());
        let mut copies = self.scratch(n * m * es);
        let recv_counts = vec![m as c_int; n];
        let recv_displs: Vec<c_int> = (0..n).map(|k| (k * m) as c_int).collect();
        let dt = datatype(dtype);
        // SAFETY: the caller vouches for `send`; `copies` holds n * m elements.
        let rc = unsafe {
            ffi::MPI_Alltoallv(
                send as *const c_void,
                counts.as_ptr(),
                displs.as_ptr(),
                dt,
                copies.as_mut_ptr() as *mut c_void,
                recv_counts.as_ptr(),
                recv_displs.as_ptr(),
                dt,
                self.comm.as_raw(),
            )
        };
        self.rc(op_name, rc)?;
        let srcs: Vec<*const u8> = (0..n).map(|k| copies[k * m * es..].as_ptr()).collect();
        // SAFETY: each source holds m elements of `dtype`; the caller vouches for `dst`.
        unsafe { fold(dtype, &srcs, &[dst], 0..m, op) };
        Ok(())
    }

    fn rc(&self, op: &'static str, rc: c_int) -> Result<()> {
        if rc != 0 {
            return Err(mpi_err(format!("{op} on rank {} returned MPI error code {rc}", self.world_rank())));
        }
        Ok(())
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn world_ranks(&self) -> &[usize] {
        &self.world_ranks
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce(&self, mut buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let (n, len, dtype) = (self.size, buf.len(), buf.dtype());
        self.count("all_reduce", len)?;
        if n == 1 {
            return Ok(());
        }
        let es = dtype.size();
        let segment = (SEGMENT_BYTES / es).max(n);
        let base = buf.as_mut_ptr();
        for start in (0..len).step_by(segment) {
            // SAFETY: start..start + the segment's length lies within `buf`.
            unsafe { self.all_reduce_segment(base.add(start * es), segment.min(len - start), dtype, op)? };
        }
        Ok(())
    }

    fn all_gather(&self, send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        let c = self.check("all_gather");
        c.same_dtype(&send, &recv)?;
        c.len(
            "receive buffer",
            recv.len(),
            send.len() * self.size,
            "all_gather receives one send buffer from each rank: recv = send x group size",
        )?;
        self.count("all_gather", recv.len())?;
        let count = self.count("all_gather", send.len())?;
        let dt = datatype(send.dtype());
        // SAFETY: lengths checked above.
        let rc = unsafe {
            ffi::MPI_Allgather(send.as_ptr() as *const c_void, count, dt, recv.as_mut_ptr() as *mut c_void, count, dt, self.comm.as_raw())
        };
        self.rc("all_gather", rc)
    }

    fn reduce_scatter(&self, send: Buf<'_>, mut recv: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let c = self.check("reduce_scatter");
        c.same_dtype(&send, &recv)?;
        c.len("send buffer", send.len(), recv.len() * self.size, "reduce_scatter sends one block per rank: send = recv x group size")?;
        self.count("reduce_scatter", send.len())?;
        let (n, m, dtype) = (self.size, recv.len(), send.dtype());
        let es = dtype.size();
        // Elements a of every rank's block j come to rank j, which folds them in rank order (as
        // LocalComm), a segment of the block at a time so that the scratch stays bounded.
        let segment = (SEGMENT_BYTES / es / n).max(1);
        for a in (0..m).step_by(segment) {
            let s = segment.min(m - a);
            let counts = vec![s as c_int; n];
            let displs: Vec<c_int> = (0..n).map(|j| (j * m + a) as c_int).collect();
            // SAFETY: block j's elements a..a + s lie within `send` (n * m elements, counted
            // above); `recv` holds m >= a + s elements.
            unsafe { self.fold_copies("reduce_scatter", send.as_ptr(), &counts, &displs, s, dtype, op, recv.as_mut_ptr().add(a * es))? };
        }
        Ok(())
    }

    fn broadcast(&self, mut buf: BufMut<'_>, root: usize) -> Result<()> {
        self.check("broadcast").peer("root", root)?;
        let count = self.count("broadcast", buf.len())?;
        // SAFETY: `buf` valid for `count` elements.
        let rc =
            unsafe { ffi::MPI_Bcast(buf.as_mut_ptr() as *mut c_void, count, datatype(buf.dtype()), root as c_int, self.comm.as_raw()) };
        self.rc("broadcast", rc)
    }

    fn all_to_all(&self, send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        let c = self.check("all_to_all");
        c.same_dtype(&send, &recv)?;
        c.len("receive buffer", recv.len(), send.len(), "all_to_all exchanges equal blocks: send and recv have the same length")?;
        c.divisible("send buffer", send.len())?;
        self.count("all_to_all", send.len())?;
        let block = (send.len() / self.size) as c_int;
        let dt = datatype(send.dtype());
        // SAFETY: lengths checked above.
        let rc = unsafe {
            ffi::MPI_Alltoall(send.as_ptr() as *const c_void, block, dt, recv.as_mut_ptr() as *mut c_void, block, dt, self.comm.as_raw())
        };
        self.rc("all_to_all", rc)
    }

    fn send(&self, buf: Buf<'_>, dest: usize, tag: u32) -> Result<()> {
        self.check("send").p2p(dest, self.rank, tag)?;
        let count = self.count("send", buf.len())?;
        // SAFETY: `buf` valid for `count` elements.
        let rc = unsafe {
            ffi::MPI_Send(buf.as_ptr() as *const c_void, count, datatype(buf.dtype()), dest as c_int, tag as c_int, self.comm.as_raw())
        };
        self.rc("send", rc)
    }

    fn recv(&self, mut buf: BufMut<'_>, src: usize, tag: u32) -> Result<()> {
        self.check("recv").p2p(src, self.rank, tag)?;
        let count = self.count("recv", buf.len())?;
        let dt = datatype(buf.dtype());
        let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::zeroed();
        // SAFETY: `buf` valid for `count` elements; status is written by MPI_Recv.
        let rc = unsafe {
            ffi::MPI_Recv(buf.as_mut_ptr() as *mut c_void, count, dt, src as c_int, tag as c_int, self.comm.as_raw(), status.as_mut_ptr())
        };
        self.rc("recv", rc)?;
        let mut got: c_int = 0;
        // SAFETY: status was filled by a successful MPI_Recv.
        let rc = unsafe { ffi::MPI_Get_count(status.as_ptr(), dt, &mut got) };
        self.rc("recv", rc)?;
        if got != count {
            return Err(CommError::MessageMismatch {
                rank: self.world_rank(),
                src: self.world_ranks[src],
                tag,
                expected_len: buf.len(),
                expected_dtype: buf.dtype(),
                got_len: got.max(0) as usize,
                got_dtype: buf.dtype(),
            });
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        // SAFETY: plain collective on a valid communicator.
        let rc = unsafe { ffi::MPI_Barrier(self.comm.as_raw()) };
        self.rc("barrier", rc)
    }

    fn split(&self, groups: &[Vec<usize>]) -> Result<Option<Box<dyn Communicator>>> {
        // Agree on the lists first: max of (h, -h) over ranks gives (max h, -min h).
        let h = (groups_hash(groups) & ((1 << 62) - 1)) as i64;
        let mut both = [h, -h];
        let count = 2;
        // SAFETY: two i64 in place.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                autopar_mpi_in_place(),
                both.as_mut_ptr() as *mut c_void,
                count,
                ffi::RSMPI_INT64_T,
                ffi::RSMPI_MAX,
                self.comm.as_raw(),
            )
        };
        self.rc("split", rc)?;
        if both[0] != h || -both[1] != h {
            return Err(CommError::Mpi {
                what: format!("split on rank {}: ranks passed different group lists (fingerprints differ)", self.world_rank()),
                hint: "every rank of the parent group must pass the same list of groups to split",
            });
        }
        let placed = validate_groups(groups, self.size, self.world_rank())?;
        let (color, key) = match placed[self.rank] {
            Some((gi, pos)) => (Color::with_value(gi as c_int), pos as c_int),
            None => (Color::undefined(), 0),
        };
        let sub = self.comm.split_by_color_with_key(color, key);
        Ok(match (sub, placed[self.rank]) {
            (Some(comm), Some((gi, pos))) => {
                let world_ranks: Vec<usize> = groups[gi].iter().map(|&r| self.world_ranks[r]).collect();
                let size = world_ranks.len();
                Some(Box::new(MpiComm { comm, rank: pos, size, world_ranks, env: self.env.clone(), scratch: RefCell::default() })
                    as Box<dyn Communicator>)
            }
            _ => None,
        })
    }
}
