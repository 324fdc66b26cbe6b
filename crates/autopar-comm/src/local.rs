//! [`LocalComm`]: N ranks as N threads of one process, talking through shared memory.
//!
//! How a collective runs (no per-element locking, no copies through a shared staging area):
//! 1. each rank publishes its buffer addresses and a description of the call in its slot and
//!    arrives at barrier A; after A every rank checks that all ranks described the same call;
//! 2. ranks read and write each other's buffers directly. In an all-reduce rank r owns the r-th
//!    chunk of every buffer: it reduces that chunk of all inputs, always in rank order
//!    `((x0 + x1) + x2) + ...`, 16 elements at a time held in vector registers, and stores the
//!    result straight into that chunk of every rank's buffer (nobody else touches the chunk), so
//!    each byte is read once and written once; barrier B ends the call. The order never depends
//!    on timing, on how the buffer is chunked or on the vector width, so results are
//!    bit-reproducible;
//! 3. the final barriers cannot be left early: a peer still copying from this rank's buffer is
//!    inside this crate's code and arrives in bounded time, and leaving would free memory it
//!    reads. Barrier A can be left early (failure, exited peer, timeout) by withdrawing the
//!    arrival atomically, so no peer ever starts reading a buffer whose owner has left.
//!
//! Failure propagation: the world (all groups made from one `LocalComm::group`/`run`) has a
//! poison flag and the first failure (rank, message). A rank that panics, returns an error from
//! [`LocalComm::run`], times out, or finds a peer gone poisons the world and wakes every waiter
//! in every group; every pending and later call then returns [`CommError::PeerFailed`].
//! A rank whose closure returned (or whose `LocalComm` was dropped) counts as finished; peers
//! waiting for it get [`CommError::PeerExited`] at once instead of hanging.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crate::comm::{groups_hash, validate_groups, Check, Communicator};
use crate::dtype::{Buf, BufMut, DType, ReduceOp};
use crate::error::{CallDesc, CommError, Result};
use crate::fold::fold;

/// Options of a group of in-process ranks.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// How long a rank waits for its peers to arrive at a collective or for a message before it
    /// fails the whole group (a peer stuck in a loop, or waiting on a message never sent).
    pub timeout: Duration,
    /// Stack size of each rank's thread in [`LocalComm::run`].
    pub stack_size: usize,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions { timeout: Duration::from_secs(30 * 60), stack_size: 16 << 20 }
    }
}

impl LocalOptions {
    /// These options with the timeout set to `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

const POLL: Duration = Duration::from_millis(100);
const SPINS: u32 = 100;
const YIELDS: u32 = 50;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct World {
    timeout: Duration,
    poisoned: AtomicBool,
    failure: Mutex<Option<(usize, String)>>,
    finished: Vec<AtomicBool>,
    groups: Mutex<Vec<Weak<Group>>>,
    /// The machine's cores, when [`LocalComm::run`] starts more ranks than there are.
    cores: Option<Arc<Cores>>,
}

/// The cores that more simulated ranks than the machine has take turns on: a rank thread of
/// [`LocalComm::run`] holds one while it computes and gives it back while it waits in a
/// collective or a receive, so no more ranks run at once than there are cores (no time-slicing
/// of computing ranks, which costs context switches and each other's caches).
struct Cores {
    /// Cores free; below zero after a rank stopped waiting for one.
    free: Mutex<isize>,
    cv: Condvar,
    /// How long a rank waits for a core before it runs without one: a quarter of the world's
    /// timeout, so a rank stuck while holding a core neither hangs the others nor, by starving
    /// one of them, makes its peers time out in a collective.
    patience: Duration,
    /// Set when the world fails: from then on nobody waits for a core (errors come back at
    /// once, as without the pool).
    abandoned: AtomicBool,
}

impl Cores {
    fn take(&self) {
        let start = Instant::now();
        let mut free = lock(&self.free);
        while *free <= 0 && !self.abandoned.load(SeqCst) && start.elapsed() < self.patience {
            free = self.cv.wait_timeout(free, POLL).unwrap_or_else(|e| e.into_inner()).0;
        }
        *free -= 1;
    }

    fn abandon(&self) {
        self.abandoned.store(true, SeqCst);
        let _l = lock(&self.free);
        self.cv.notify_all();
    }

    fn give(&self) {
        *lock(&self.free) += 1;
        self.cv.notify_one();
    }
}

thread_local! {
    /// The cores this thread holds one of (a rank thread of an oversubscribed `run`).
    static HELD_CORE: std::cell::RefCell<Option<Arc<Cores>>> = const { std::cell::RefCell::new(None) };
}

/// Holds one of `cores` for the life of a rank thread.
struct CoreHold;

impl CoreHold {
    fn new(cores: Option<&Arc<Cores>>) -> Option<CoreHold> {
        let cores = cores?;
        cores.take();
        HELD_CORE.with(|h| *h.borrow_mut() = Some(cores.clone()));
        Some(CoreHold)
    }
}

impl Drop for CoreHold {
    fn drop(&mut self) {
        if let Some(c) = HELD_CORE.with(|h| h.borrow_mut().take()) {
            c.give();
        }
    }
}

/// This thread's core given back while it waits, and taken again when the wait ends.
struct CoreLent(Option<Arc<Cores>>);

impl CoreLent {
    fn new() -> CoreLent {
        let cores = HELD_CORE.with(|h| h.borrow().clone());
        if let Some(c) = &cores {
            c.give();
        }
        CoreLent(cores)
    }
}

impl Drop for CoreLent {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.take();
        }
    }
}

/// Runs `wait` with this rank thread's core (of an oversubscribed [`LocalComm::run`]) given to
/// the other ranks, and takes one again before returning: for a rank that waits for work from
/// outside the job, such as the next batch of a driver that steps the ranks one call at a time.
pub fn lend_core_while<T>(wait: impl FnOnce() -> T) -> T {
    let _lent = CoreLent::new();
    wait()
}

impl World {
    fn poison(&self, rank: usize, message: String) {
        {
            let mut f = lock(&self.failure);
            if f.is_none() {
                *f = Some((rank, message));
            }
        }
        self.poisoned.store(true, SeqCst);
        if let Some(c) = &self.cores {
            c.abandon();
        }
        self.wake_all();
    }

    fn finish(&self, rank: usize) {
        self.finished[rank].store(true, SeqCst);
        self.wake_all();
    }

    fn wake_all(&self) {
        let groups: Vec<Arc<Group>> = lock(&self.groups).iter().filter_map(Weak::upgrade).collect();
        for g in groups {
            let _l = lock(&g.mailbox);
            g.cv.notify_all();
        }
    }

    fn failure(&self) -> Option<(usize, String)> {
        lock(&self.failure).clone()
    }

    fn register(&self, g: &Arc<Group>) {
        let mut groups = lock(&self.groups);
        groups.retain(|w| w.strong_count() > 0);
        groups.push(Arc::downgrade(g));
    }
}

#[derive(Clone, Copy)]
struct Slot {
    desc: CallDesc,
    send: *const u8,
    recv: *mut u8,
    /// An all-reduce of parts: the caller's table of (address, elements), and its length.
    parts: (*const (*mut u8, usize), usize),
}

const NO_PARTS: (*const (*mut u8, usize), usize) = (std::ptr::null(), 0);

// SAFETY: the addresses are only dereferenced between the barriers of one call, while their
// owner is blocked inside the same call (see the module docs).
unsafe impl Send for Slot {}

const EMPTY_DESC: CallDesc = CallDesc { op: "", seq: 0, dtype: None, send_len: 0, recv_len: 0, reduce: None, root: 0, groups_hash: 0 };

struct Message {
    dtype: DType,
    len: usize,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct Mailbox {
    queues: HashMap<(usize, usize, u32), VecDeque<Message>>,
}

struct Group {
    world: Arc<World>,
    members: Vec<usize>,
    slots: Vec<Mutex<Slot>>,
    /// generation << 32 | arrived count.
    state: AtomicU64,
    parked: AtomicUsize,
    mailbox: Mutex<Mailbox>,
    cv: Condvar,
    split_out: Mutex<Vec<Arc<Group>>>,
    /// Busy-wait rounds at a barrier before yielding: none when the world has more ranks than
    /// the machine has cores (they take turns on the cores, and a spinning rank would hold a
    /// core a late peer needs).
    spins: u32,
}

impl Group {
    fn new(world: &Arc<World>, members: Vec<usize>) -> Arc<Group> {
        let n = members.len();
        let g = Arc::new(Group {
            world: world.clone(),
            members,
            slots: (0..n)
                .map(|_| Mutex::new(Slot { desc: EMPTY_DESC, send: std::ptr::null(), recv: std::ptr::null_mut(), parts: NO_PARTS }))
                .collect(),
            state: AtomicU64::new(0),
            parked: AtomicUsize::new(0),
            mailbox: Mutex::new(Mailbox::default()),
            cv: Condvar::new(),
            split_out: Mutex::new(Vec::new()),
            spins: if world.cores.is_some() { 0 } else { SPINS },
        });
        world.register(&g);
        g
    }

    fn finished_member(&self) -> Option<usize> {
        self.members.iter().copied().find(|&w| self.world.finished[w].load(SeqCst))
    }

    fn wake_if_parked(&self) {
        if self.parked.load(SeqCst) > 0 {
            let _l = lock(&self.mailbox);
            self.cv.notify_all();
        }
    }

    /// Take back an arrival at a barrier that has not completed. False when it completed.
    fn withdraw(&self, gen: u64) -> bool {
        let mut v = self.state.load(SeqCst);
        loop {
            if v >> 32 != gen {
                return false;
            }
            match self.state.compare_exchange_weak(v, v - 1, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(x) => v = x,
            }
        }
    }
}

/// Keeps track of whether a rank is still alive; the last handle of a rank going away marks it
/// finished (or failed, when its thread is panicking).
struct RankGuard {
    world: Arc<World>,
    rank: usize,
}

impl Drop for RankGuard {
    fn drop(&mut self) {
        if thread::panicking() {
            self.world.poison(self.rank, "panicked".to_string());
        } else {
            self.world.finish(self.rank);
        }
    }
}

/// One rank of a group of in-process ranks. `Send`, not `Sync`: one thread drives one rank.
pub struct LocalComm {
    group: Arc<Group>,
    rank: usize,
    seq: Cell<u64>,
    guard: Arc<RankGuard>,
}

impl fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalComm").field("rank", &self.rank).field("members", &self.group.members).finish()
    }
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

fn chunk_range(len: usize, n: usize, i: usize, elem: usize) -> Range<usize> {
    let align = (64 / elem).max(1);
    let per = len.div_ceil(n).div_ceil(align) * align;
    let start = (i * per).min(len);
    start..(start + per).min(len)
}

impl LocalComm {
    /// Run `f` on `n` ranks, one thread each, and return every rank's result in rank order.
    ///
    /// When a rank panics or returns an error, every other rank's pending and later
    /// collectives fail at once and this returns [`CommError::RankFailed`] naming the first
    /// rank that failed and its message.
    ///
    /// With more ranks than the machine has cores, the ranks take turns on the cores: a rank
    /// computes while it holds one and lends it while it waits in a collective or a receive.
    /// Ranks should wait on each other only through the communicator (a rank blocked on
    /// anything else keeps its core).
    pub fn run<R, E, F>(n: usize, f: F) -> Result<Vec<R>>
    where
        R: Send,
        E: fmt::Display,
        F: Fn(LocalComm) -> std::result::Result<R, E> + Sync,
    {
        Self::run_with(n, LocalOptions::default(), f)
    }

    /// [`LocalComm::run`] with options (timeout, stack size).
    pub fn run_with<R, E, F>(n: usize, opts: LocalOptions, f: F) -> Result<Vec<R>>
    where
        R: Send,
        E: fmt::Display,
        F: Fn(LocalComm) -> std::result::Result<R, E> + Sync,
    {
        let comms = Self::group_with(n, opts.clone())?;
        let world = comms[0].group.world.clone();
        let f = &f;
        // A rank thread that runs a nested group lends its core while it waits for it.
        let lent = CoreLent::new();
        let results: Vec<Option<R>> = thread::scope(|s| {
            let mut handles = Vec::with_capacity(n);
            for (r, comm) in comms.into_iter().enumerate() {
                let guard = comm.guard.clone();
                let w = world.clone();
                let spawned = thread::Builder::new().name(format!("rank-{r}")).stack_size(opts.stack_size).spawn_scoped(s, move || {
                    let core = CoreHold::new(w.cores.as_ref());
                    let out = catch_unwind(AssertUnwindSafe(|| f(comm)));
                    drop(core);
                    let value = match out {
                        Ok(Ok(v)) => {
                            w.finish(r);
                            Some(v)
                        }
                        Ok(Err(e)) => {
                            w.poison(r, format!("{e:#}"));
                            None
                        }
                        Err(p) => {
                            w.poison(r, panic_message(p.as_ref()));
                            None
                        }
                    };
                    drop(guard);
                    value
                });
                match spawned {
                    Ok(h) => handles.push(Some(h)),
                    Err(e) => {
                        world.poison(r, CommError::Spawn { rank: r, source: e }.to_string());
                        handles.push(None);
                    }
                }
            }
            handles
                .into_iter()
                .enumerate()
                .map(|(r, h)| match h.map(|h| h.join()) {
                    Some(Ok(v)) => v,
                    Some(Err(p)) => {
                        world.poison(r, panic_message(p.as_ref()));
                        None
                    }
                    None => None,
                })
                .collect()
        });
        drop(lent);
        if let Some((rank, message)) = world.failure() {
            return Err(CommError::RankFailed { rank, message });
        }
        Ok(results.into_iter().map(|v| v.expect("a rank without failure has a result")).collect())
    }

    /// The communicators of a group of `n` ranks, to hand to threads of your own. A rank whose
    /// communicator is dropped counts as finished (as failed if its thread is panicking).
    pub fn group(n: usize) -> Result<Vec<LocalComm>> {
        Self::group_with(n, LocalOptions::default())
    }

    /// [`LocalComm::group`] with options.
    pub fn group_with(n: usize, opts: LocalOptions) -> Result<Vec<LocalComm>> {
        if n == 0 {
            return Err(CommError::NoRanks { n });
        }
        let world = Arc::new(World {
            timeout: opts.timeout,
            poisoned: AtomicBool::new(false),
            failure: Mutex::new(None),
            finished: (0..n).map(|_| AtomicBool::new(false)).collect(),
            groups: Mutex::new(Vec::new()),
            cores: thread::available_parallelism().ok().map(|c| c.get()).filter(|&c| n > c).map(|c| {
                Arc::new(Cores {
                    free: Mutex::new(c as isize),
                    cv: Condvar::new(),
                    patience: opts.timeout / 4,
                    abandoned: AtomicBool::new(false),
                })
            }),
        });
        let group = Group::new(&world, (0..n).collect());
        Ok((0..n)
            .map(|r| LocalComm {
                group: group.clone(),
                rank: r,
                seq: Cell::new(0),
                guard: Arc::new(RankGuard { world: world.clone(), rank: r }),
            })
            .collect())
    }

    /// Fail the whole world on behalf of this rank: every pending and later collective of every
    /// rank returns an error naming this rank and `message`.
    pub fn abort(&self, message: impl Into<String>) {
        self.group.world.poison(self.world_rank(), message.into());
    }

    /// The first failure of the world, if any: (world rank, message).
    pub fn failure(&self) -> Option<(usize, String)> {
        self.group.world.failure()
    }

    fn world_rank(&self) -> usize {
        self.group.members[self.rank]
    }

    fn n(&self) -> usize {
        self.group.members.len()
    }

    fn check(&self, op: &'static str) -> Check<'_> {
        Check { op, rank: self.world_rank(), size: self.n(), _world: &self.group.members }
    }

    fn peer_failed(&self, op: &'static str) -> CommError {
        let (failed_rank, message) = self.group.world.failure().unwrap_or((usize::MAX, "unknown failure".to_string()));
        CommError::PeerFailed { op, rank: self.world_rank(), failed_rank, message }
    }

    fn ensure_alive(&self, op: &'static str) -> Result<()> {
        if self.group.world.poisoned.load(SeqCst) {
            return Err(self.peer_failed(op));
        }
        Ok(())
    }

    fn desc(&self, op: &'static str, dtype: Option<DType>, send_len: usize, recv_len: usize) -> CallDesc {
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        CallDesc { op, seq, dtype, send_len, recv_len, reduce: None, root: 0, groups_hash: 0 }
    }

    /// Fail the world for an error this rank found itself, and return it.
    fn fail(&self, e: CommError) -> CommError {
        if !matches!(e, CommError::PeerFailed { .. }) {
            self.group.world.poison(self.world_rank(), e.to_string());
        }
        e
    }

    /// Publish this rank's call, wait for all (abortable), check that everyone made the same
    /// call, and return all slots.
    fn exchange(&self, desc: CallDesc, send: *const u8, recv: *mut u8) -> Result<Vec<Slot>> {
        self.exchange_slot(Slot { desc, send, recv, parts: NO_PARTS })
    }

    /// [`LocalComm::exchange`] of a whole slot.
    fn exchange_slot(&self, slot: Slot) -> Result<Vec<Slot>> {
        let desc = slot.desc;
        *lock(&self.group.slots[self.rank]) = slot;
        self.wait(&desc, true).map_err(|e| self.fail(e))?;
        let slots: Vec<Slot> = self.group.slots.iter().map(|s| *lock(s)).collect();
        for (k, s) in slots.iter().enumerate().skip(1) {
            if s.desc != slots[0].desc {
                return Err(CommError::Mismatch {
                    rank: self.group.members[0],
                    peer: self.group.members[k],
                    mine: Box::new(slots[0].desc),
                    theirs: Box::new(s.desc),
                });
            }
        }
        Ok(slots)
    }

    /// A call of parts: publish this rank's `table` (each part's address and elements), wait
    /// for every rank, check that every table has the first one's lengths, run `f` over all
    /// ranks' tables (in rank order) and leave after the final barrier, so that a peer may
    /// read this rank's parts until then. A length mismatch is an error on every rank.
    fn with_tables<R>(&self, desc: CallDesc, table: &[(*mut u8, usize)], f: impl FnOnce(&[&[(*mut u8, usize)]]) -> R) -> Result<R> {
        let slots =
            self.exchange_slot(Slot { desc, send: std::ptr::null(), recv: std::ptr::null_mut(), parts: (table.as_ptr(), table.len()) })?;
        // SAFETY: every peer's table lives until it leaves this call, after the final barrier;
        // the tables are only read.
        let tables: Vec<&[(*mut u8, usize)]> = slots.iter().map(|s| unsafe { std::slice::from_raw_parts(s.parts.0, s.parts.1) }).collect();
        // Every rank compares every table with the first one's, so all ranks see the same
        // mismatch; they leave the call together, after the final barrier (a peer may still
        // be reading this rank's table).
        let mismatch = tables.iter().enumerate().skip(1).find_map(|(k, t)| {
            let part = (0..t.len().max(tables[0].len())).find(|&p| t.get(p).map(|e| e.1) != tables[0].get(p).map(|e| e.1))?;
            let (got, expected) = match (t.get(part), tables[0].get(part)) {
                (Some(a), Some(b)) => (a.1, b.1),
                _ => (t.len(), tables[0].len()),
            };
            Some(CommError::PartsMismatch { op: desc.op, rank: self.group.members[0], peer: self.group.members[k], part, got, expected })
        });
        let out = match mismatch {
            Some(e) => Err(e),
            None => Ok(f(&tables)),
        };
        self.done(&desc);
        out
    }

    /// A barrier of the group. `abortable`: may be left on failure, exited peer or timeout.
    fn wait(&self, desc: &CallDesc, abortable: bool) -> Result<()> {
        let g = &*self.group;
        let n = g.members.len() as u64;
        let mut v = g.state.load(SeqCst);
        let gen = loop {
            let (gen, cnt) = (v >> 32, v & 0xffff_ffff);
            let last = cnt + 1 == n;
            let new = if last { ((gen + 1) & 0xffff_ffff) << 32 } else { v + 1 };
            match g.state.compare_exchange_weak(v, new, SeqCst, SeqCst) {
                Ok(_) if last => {
                    g.wake_if_parked();
                    return Ok(());
                }
                Ok(_) => break gen,
                Err(x) => v = x,
            }
        };
        // Peers that have not arrived may need this thread's core. (Yielding before parking
        // still pays with more ranks than cores: parking at once measured slower.)
        let _lent = CoreLent::new();
        for i in 0..g.spins + YIELDS {
            if g.state.load(SeqCst) >> 32 != gen {
                return Ok(());
            }
            if i < g.spins {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        let start = Instant::now();
        let timeout = g.world.timeout;
        let mut guard = lock(&g.mailbox);
        g.parked.fetch_add(1, SeqCst);
        let result = loop {
            let exited = if abortable { g.finished_member() } else { None };
            let poisoned = g.world.poisoned.load(SeqCst);
            if g.state.load(SeqCst) >> 32 != gen {
                break Ok(());
            }
            let mut wait_for = POLL;
            if abortable {
                let elapsed = start.elapsed();
                let err = if poisoned {
                    Some(self.peer_failed(desc.op))
                } else if let Some(peer) = exited {
                    Some(CommError::PeerExited { op: desc.op, rank: self.world_rank(), peer })
                } else if elapsed >= timeout {
                    let missing = g.members.iter().zip(&g.slots).filter(|(_, s)| lock(s).desc.seq < desc.seq).map(|(&w, _)| w).collect();
                    Some(CommError::Timeout { op: desc.op, rank: self.world_rank(), waited_s: elapsed.as_secs_f64(), missing })
                } else {
                    wait_for = (timeout - elapsed).min(POLL);
                    None
                };
                if let Some(e) = err {
                    break if g.withdraw(gen) { Err(e) } else { Ok(()) };
                }
            }
            guard = g.cv.wait_timeout(guard, wait_for).unwrap_or_else(|e| e.into_inner()).0;
        };
        g.parked.fetch_sub(1, SeqCst);
        drop(guard);
        result
    }

    fn done(&self, desc: &CallDesc) {
        // A final barrier cannot fail: it is never abortable.
        let _ = self.wait(desc, false);
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.n()
    }

    fn world_ranks(&self) -> &[usize] {
        &self.group.members
    }

    fn backend(&self) -> &'static str {
        "local"
    }

    fn all_reduce(&self, mut buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.ensure_alive("all_reduce")?;
        let n = self.n();
        let (dtype, len, es) = (buf.dtype(), buf.len(), buf.dtype().size());
        let mut desc = self.desc("all_reduce", Some(dtype), len, len);
        desc.reduce = Some(op);
        if n == 1 {
            return Ok(());
        }
        let ptr = buf.as_mut_ptr();
        let slots = self.exchange(desc, ptr, ptr)?;
        let srcs: Vec<*const u8> = slots.iter().map(|s| s.recv as *const u8).collect();
        let dsts: Vec<*mut u8> = slots.iter().map(|s| s.recv).collect();
        // SAFETY: every peer is blocked in this call until barrier B; chunk `rank` of every
        // buffer is read and written by this rank only (reduced once, then written to all).
        unsafe { fold(dtype, &srcs, &dsts, chunk_range(len, n, self.rank, es), op) };
        self.done(&desc);
        Ok(())
    }

    fn all_reduce_parts(&self, parts: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
        self.ensure_alive("all_reduce_parts")?;
        // Mixed types fail the world, so that the peers' calls end at once too.
        let dtype = crate::comm::parts_dtype("all_reduce_parts", parts.iter().map(BufMut::dtype), self.world_rank())
            .map_err(|e| self.fail(e))?
            .unwrap_or(DType::F32);
        let (n, es) = (self.n(), dtype.size());
        let len: usize = parts.iter().map(BufMut::len).sum();
        // A call of its own name: a peer calling `all_reduce` at this point is a mismatch.
        let mut desc = self.desc("all_reduce_parts", Some(dtype), len, len);
        desc.reduce = Some(op);
        if n == 1 {
            return Ok(());
        }
        let table: Vec<(*mut u8, usize)> = parts.iter_mut().map(|p| (p.as_mut_ptr(), p.len())).collect();
        self.with_tables(desc, &table, |tables| {
            // This rank's chunk of the concatenation, reduced part by part where the parts lie.
            let chunk = chunk_range(len, n, self.rank, es);
            let mut at = 0;
            for (p, &(_, part_len)) in tables[0].iter().enumerate() {
                let (lo, hi) = (chunk.start.max(at), chunk.end.min(at + part_len));
                if lo < hi {
                    let dsts: Vec<*mut u8> = tables.iter().map(|t| t[p].0).collect();
                    let srcs: Vec<*const u8> = dsts.iter().map(|&d| d as *const u8).collect();
                    // SAFETY: every peer is blocked in this call until the final barrier;
                    // these elements of every rank's part are read and written by this rank only.
                    unsafe { fold(dtype, &srcs, &dsts, lo - at..hi - at, op) };
                }
                at += part_len;
            }
        })
    }

    fn all_gather_parts(&self, send: &[Buf<'_>], recv: &mut [BufMut<'_>]) -> Result<()> {
        self.ensure_alive("all_gather_parts")?;
        let dtype = crate::comm::check_parts(&self.check("all_gather_parts"), send, recv, true).map_err(|e| self.fail(e))?;
        let es = dtype.map_or(0, DType::size);
        let len: usize = send.iter().map(Buf::len).sum();
        let desc = self.desc("all_gather_parts", dtype, len, len * self.n());
        // Only read by the peers.
        let table: Vec<(*mut u8, usize)> = send.iter().map(|p| (p.as_ptr() as *mut u8, p.len())).collect();
        self.with_tables(desc, &table, |tables| {
            for (p, out) in recv.iter_mut().enumerate() {
                let bytes = tables[0][p].1 * es;
                let out = out.as_mut_ptr();
                for (k, t) in tables.iter().enumerate() {
                    // SAFETY: the peers' send parts are live and unmodified until the final
                    // barrier; `out` is this rank's, `size()` parts long (checked).
                    unsafe { std::ptr::copy_nonoverlapping(t[p].0 as *const u8, out.add(k * bytes), bytes) };
                }
            }
        })
    }

    fn reduce_scatter_parts(&self, send: &[Buf<'_>], recv: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
        self.ensure_alive("reduce_scatter_parts")?;
        let dtype = crate::comm::check_parts(&self.check("reduce_scatter_parts"), send, recv, false).map_err(|e| self.fail(e))?;
        let len: usize = send.iter().map(Buf::len).sum();
        let mut desc = self.desc("reduce_scatter_parts", dtype, len, len / self.n());
        desc.reduce = Some(op);
        let table: Vec<(*mut u8, usize)> = send.iter().map(|p| (p.as_ptr() as *mut u8, p.len())).collect();
        self.with_tables(desc, &table, |tables| {
            let Some(dtype) = dtype else { return };
            for (p, out) in recv.iter_mut().enumerate() {
                let block = out.len();
                let off = self.rank * block * dtype.size();
                // SAFETY: the peers' send parts are read-only for everyone until the final
                // barrier; `out` is this rank's, one block long (checked).
                let srcs: Vec<*const u8> = tables.iter().map(|t| unsafe { (t[p].0 as *const u8).add(off) }).collect();
                unsafe { fold(dtype, &srcs, &[out.as_mut_ptr()], 0..block, op) };
            }
        })
    }

    fn all_gather(&self, send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        self.ensure_alive("all_gather")?;
        let c = self.check("all_gather");
        let n = self.n();
        c.same_dtype(&send, &recv)?;
        c.len(
            "receive buffer",
            recv.len(),
            send.len() * n,
            "all_gather receives one send buffer from each rank: recv = send x group size",
        )?;
        let desc = self.desc("all_gather", Some(send.dtype()), send.len(), recv.len());
        let b = send.byte_len();
        let out = recv.as_mut_ptr();
        let slots = self.exchange(desc, send.as_ptr(), out)?;
        for (k, slot) in slots.iter().enumerate() {
            // SAFETY: peers' send buffers are live and unmodified until barrier B.
            unsafe { std::ptr::copy_nonoverlapping(slot.send, out.add(k * b), b) };
        }
        self.done(&desc);
        Ok(())
    }

    fn reduce_scatter(&self, send: Buf<'_>, mut recv: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.ensure_alive("reduce_scatter")?;
        let c = self.check("reduce_scatter");
        let n = self.n();
        c.same_dtype(&send, &recv)?;
        c.len("send buffer", send.len(), recv.len() * n, "reduce_scatter sends one block per rank: send = recv x group size")?;
        let mut desc = self.desc("reduce_scatter", Some(send.dtype()), send.len(), recv.len());
        desc.reduce = Some(op);
        let (dtype, block) = (send.dtype(), recv.len());
        let out = recv.as_mut_ptr();
        let slots = self.exchange(desc, send.as_ptr(), out)?;
        let off = self.rank * block * dtype.size();
        // SAFETY: send buffers are read-only for everyone until barrier B; `recv` is ours.
        let srcs: Vec<*const u8> = slots.iter().map(|s| unsafe { s.send.add(off) }).collect();
        unsafe { fold(dtype, &srcs, &[out], 0..block, op) };
        self.done(&desc);
        Ok(())
    }

    fn broadcast(&self, mut buf: BufMut<'_>, root: usize) -> Result<()> {
        self.ensure_alive("broadcast")?;
        self.check("broadcast").peer("root", root)?;
        let mut desc = self.desc("broadcast", Some(buf.dtype()), buf.len(), buf.len());
        desc.root = root;
        if self.n() == 1 {
            return Ok(());
        }
        let b = buf.byte_len();
        let ptr = buf.as_mut_ptr();
        let slots = self.exchange(desc, ptr, ptr)?;
        if self.rank != root {
            // SAFETY: the root's buffer is unmodified until barrier B.
            unsafe { std::ptr::copy_nonoverlapping(slots[root].recv, ptr, b) };
        }
        self.done(&desc);
        Ok(())
    }

    fn all_to_all(&self, send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        self.ensure_alive("all_to_all")?;
        let c = self.check("all_to_all");
        let n = self.n();
        c.same_dtype(&send, &recv)?;
        c.len("receive buffer", recv.len(), send.len(), "all_to_all exchanges equal blocks: send and recv have the same length")?;
        c.divisible("send buffer", send.len())?;
        let desc = self.desc("all_to_all", Some(send.dtype()), send.len(), recv.len());
        let bb = send.byte_len() / n;
        let out = recv.as_mut_ptr();
        let slots = self.exchange(desc, send.as_ptr(), out)?;
        for (k, slot) in slots.iter().enumerate() {
            // SAFETY: send buffers are read-only until barrier B.
            unsafe { std::ptr::copy_nonoverlapping(slot.send.add(self.rank * bb), out.add(k * bb), bb) };
        }
        self.done(&desc);
        Ok(())
    }

    fn send(&self, buf: Buf<'_>, dest: usize, tag: u32) -> Result<()> {
        self.ensure_alive("send")?;
        self.check("send").p2p(dest, self.rank, tag)?;
        let msg = Message { dtype: buf.dtype(), len: buf.len(), bytes: buf.as_bytes().to_vec() };
        let g = &*self.group;
        let mut mb = lock(&g.mailbox);
        mb.queues.entry((self.rank, dest, tag)).or_default().push_back(msg);
        g.cv.notify_all();
        Ok(())
    }

    fn recv(&self, mut buf: BufMut<'_>, src: usize, tag: u32) -> Result<()> {
        self.ensure_alive("recv")?;
        self.check("recv").p2p(src, self.rank, tag)?;
        let g = &*self.group;
        let start = Instant::now();
        // Declared before the mailbox lock so it is dropped (its core taken again) after it.
        let mut lent: Option<CoreLent> = None;
        let mut mb = lock(&g.mailbox);
        let msg = loop {
            let src_gone = g.world.finished[g.members[src]].load(SeqCst);
            if g.world.poisoned.load(SeqCst) {
                return Err(self.peer_failed("recv"));
            }
            if let Some(m) = mb.queues.get_mut(&(src, self.rank, tag)).and_then(VecDeque::pop_front) {
                break m;
            }
            let elapsed = start.elapsed();
            if src_gone || elapsed >= g.world.timeout {
                drop(mb);
                let e = if src_gone {
                    CommError::PeerExited { op: "recv", rank: self.world_rank(), peer: g.members[src] }
                } else {
                    CommError::Timeout {
                        op: "recv",
                        rank: self.world_rank(),
                        waited_s: elapsed.as_secs_f64(),
                        missing: vec![g.members[src]],
                    }
                };
                return Err(self.fail(e));
            }
            let wait_for = (g.world.timeout - elapsed).min(POLL);
            lent.get_or_insert_with(CoreLent::new);
            mb = g.cv.wait_timeout(mb, wait_for).unwrap_or_else(|e| e.into_inner()).0;
        };
        drop(mb);
        drop(lent);
        if msg.dtype != buf.dtype() || msg.len != buf.len() {
            return Err(CommError::MessageMismatch {
                rank: self.world_rank(),
                src: g.members[src],
                tag,
                expected_len: buf.len(),
                expected_dtype: buf.dtype(),
                got_len: msg.len,
                got_dtype: msg.dtype,
            });
        }
        buf.as_bytes_mut().copy_from_slice(&msg.bytes);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.ensure_alive("barrier")?;
        let desc = self.desc("barrier", None, 0, 0);
        if self.n() == 1 {
            return Ok(());
        }
        self.exchange(desc, std::ptr::null(), std::ptr::null_mut())?;
        // Nobody may publish its next call before every rank has read this one's slots.
        self.done(&desc);
        Ok(())
    }

    fn split(&self, groups: &[Vec<usize>]) -> Result<Option<Box<dyn Communicator>>> {
        self.ensure_alive("split")?;
        let mut desc = self.desc("split", None, 0, 0);
        desc.groups_hash = groups_hash(groups);
        let placed = validate_groups(groups, self.n(), self.world_rank())?;
        self.exchange(desc, std::ptr::null(), std::ptr::null_mut())?;
        let g = &*self.group;
        if self.rank == 0 {
            let built: Vec<Arc<Group>> =
                groups.iter().map(|list| Group::new(&g.world, list.iter().map(|&r| g.members[r]).collect())).collect();
            *lock(&g.split_out) = built;
        }
        self.done(&desc);
        let mine = placed[self.rank].map(|(gi, pos)| (lock(&g.split_out)[gi].clone(), pos));
        self.done(&desc);
        if self.rank == 0 {
            lock(&g.split_out).clear();
        }
        Ok(mine.map(|(group, pos)| {
            Box::new(LocalComm { group, rank: pos, seq: Cell::new(0), guard: self.guard.clone() }) as Box<dyn Communicator>
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_partition_the_buffer_on_cache_line_boundaries() {
        for len in [0, 1, 7, 16, 17, 1000, 4099] {
            for n in 1..=8 {
                let ranges: Vec<_> = (0..n).map(|i| chunk_range(len, n, i, 4)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[n - 1].end, len);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[1].start % 16 == 0 || w[1].start == len);
                }
            }
        }
    }

    #[test]
    fn a_group_of_zero_ranks_is_an_error() {
        assert!(matches!(LocalComm::group(0), Err(CommError::NoRanks { n: 0 })));
    }
}
