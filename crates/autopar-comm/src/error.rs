//! The crate's one error type. Every variant names the (world) rank that saw the problem.

use std::fmt;

use crate::dtype::DType;

/// Result of every collective.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// The largest message tag every backend accepts (MPI guarantees at least 32767).
pub const MAX_TAG: u32 = 32767;

/// What one rank passed to a collective: kind, element type, lengths, operation and root.
/// Ranks that disagree on it are reported with both descriptions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDesc {
    /// The call (`all_reduce`, `broadcast`, `split`, ...).
    pub op: &'static str,
    /// The call's number among this communicator's collectives, counted from 1.
    pub seq: u64,
    /// The element type, for calls that move data.
    pub dtype: Option<DType>,
    /// Elements in the send buffer.
    pub send_len: usize,
    /// Elements in the receive buffer.
    pub recv_len: usize,
    /// The reduction operation, for reducing calls.
    pub reduce: Option<crate::dtype::ReduceOp>,
    /// The root of a broadcast, counted in the group (0 for other calls).
    pub root: usize,
    /// A hash of the groups passed to a split (0 for other calls).
    pub groups_hash: u64,
}

impl fmt::Display for CallDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (collective #{})", self.op, self.seq)?;
        if let Some(d) = self.dtype {
            write!(f, " {d} send {} recv {} elements", self.send_len, self.recv_len)?;
        }
        if let Some(r) = self.reduce {
            write!(f, " op {r}")?;
        }
        if self.op == "broadcast" {
            write!(f, " root {}", self.root)?;
        }
        if self.op == "split" {
            write!(f, " groups #{:016x}", self.groups_hash)?;
        }
        Ok(())
    }
}

/// Everything that can go wrong while ranks talk to each other.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// A buffer's length does not fit the call.
    #[error("{op} on rank {rank}: {what} holds {got} elements, expected {expected}\nhint: {hint}")]
    BufferSize {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// Which buffer, in words.
        what: &'static str,
        /// Its length in elements.
        got: usize,
        /// The length the call needs, in elements.
        expected: usize,
        /// How to fix it.
        hint: &'static str,
    },

    /// The send and receive buffers of one call have different element types.
    #[error("{op} on rank {rank}: send buffer is {send}, receive buffer is {recv}\nhint: both buffers of one call must have the same element type")]
    DTypeMismatch {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// The send buffer's element type.
        send: DType,
        /// The receive buffer's element type.
        recv: DType,
    },

    /// The parts of one call of parts have different element types.
    #[error("{op} on rank {rank}: part {part} is {got}, part 0 is {expected}\nhint: the parts of one {op} call share an element type; pass each type in a call of its own")]
    MixedParts {
        /// The call (`all_reduce_parts`, `all_gather_parts`, `reduce_scatter_parts`).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// The first part of another type, counted from 0.
        part: usize,
        /// Its element type.
        got: DType,
        /// The first part's element type.
        expected: DType,
    },

    /// Ranks passed parts of different lengths to one call of parts.
    #[error("{op}: part {part} holds {got} elements on rank {peer} but {expected} on rank {rank}\nhint: every rank passes the parts of a fused {op} with the same lengths in the same order")]
    PartsMismatch {
        /// The call (`all_reduce_parts`, `all_gather_parts`, `reduce_scatter_parts`).
        op: &'static str,
        /// The group's first rank, counted in the world.
        rank: usize,
        /// The rank whose part differs, counted in the world.
        peer: usize,
        /// The part, counted from 0 (or the count of parts, when that differs).
        part: usize,
        /// Its length on `peer` (elements; the number of parts when those differ).
        got: usize,
        /// Its length on `rank`.
        expected: usize,
    },

    /// A peer rank is not in the group.
    #[error("{op} on rank {rank}: {what} {peer} is not in this group of {size} ranks\nhint: ranks inside a group count from 0 to {size} - 1; use the group's own ranks, not global ones")]
    RankOutOfRange {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// Which peer, in words (`root`, `source`, `destination`, ...).
        what: &'static str,
        /// The peer rank that was given, counted in the group.
        peer: usize,
        /// Ranks in the group.
        size: usize,
    },

    /// A rank tried to send to or receive from itself.
    #[error("{op} on rank {rank}: a rank cannot send to or receive from itself\nhint: copy the buffer locally instead")]
    SelfMessage {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
    },

    /// A message tag is above [`MAX_TAG`].
    #[error("{op} on rank {rank}: tag {tag} is above the largest portable tag {max}\nhint: use tags from 0 to {max}")]
    TagOutOfRange {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// The tag that was given.
        tag: u32,
        /// The largest tag allowed.
        max: u32,
    },

    /// Ranks of a group made different collective calls at the same point.
    #[error("ranks called different collectives\n  rank {rank}: {mine}\n  rank {peer}: {theirs}\nhint: every rank of a group must call the same collectives in the same order, with the same element type, sizes, operation and root")]
    Mismatch {
        /// The first rank of the group, counted in the world.
        rank: usize,
        /// The rank whose call differs, counted in the world.
        peer: usize,
        /// The first rank's call.
        mine: Box<CallDesc>,
        /// The differing rank's call.
        theirs: Box<CallDesc>,
    },

    /// A received message's element type or length differs from the receive buffer's.
    #[error("recv on rank {rank} from rank {src} tag {tag}: message holds {got_len} {got_dtype} elements, expected {expected_len} {expected_dtype}\nhint: sender and receiver must agree on the element type and length of each tagged message")]
    MessageMismatch {
        /// The receiving rank, counted in the world.
        rank: usize,
        /// The sending rank, counted in the world.
        src: usize,
        /// The message tag.
        tag: u32,
        /// Elements the receive buffer holds.
        expected_len: usize,
        /// The receive buffer's element type.
        expected_dtype: DType,
        /// Elements in the message.
        got_len: usize,
        /// The message's element type.
        got_dtype: DType,
    },

    /// A call stopped because another rank failed first.
    #[error("{op} on rank {rank} stopped: rank {failed_rank} failed\n  {message}\nhint: the first failure is the cause; the other ranks stop with this error")]
    PeerFailed {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// The rank that failed first, counted in the world.
        failed_rank: usize,
        /// That rank's error, in words.
        message: String,
    },

    /// A call cannot complete because a peer finished its work without joining it.
    #[error("{op} on rank {rank} cannot complete: rank {peer} finished its work without joining it\nhint: every rank of a group must call the same collectives; check for a rank-dependent early return")]
    PeerExited {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// The rank that finished, counted in the world.
        peer: usize,
    },

    /// A call waited longer than the timeout for other ranks.
    #[error("{op} on rank {rank} timed out after {waited_s:.1} s waiting for rank(s) {missing:?}\nhint: a rank is stuck or skipped this call; raise the timeout with LocalOptions::timeout if a rank legitimately needs longer")]
    Timeout {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// Seconds waited.
        waited_s: f64,
        /// The ranks that did not arrive, counted in the world.
        missing: Vec<usize>,
    },

    /// A rank's work failed or panicked.
    #[error("rank {rank} failed\n  {message}")]
    RankFailed {
        /// The rank, counted in the world.
        rank: usize,
        /// What happened, in words.
        message: String,
    },

    /// The groups passed to a split are invalid.
    #[error("split on rank {rank}: invalid groups: {problem}\nhint: groups are lists of ranks of the parent group, non-empty, each rank in at most one group, e.g. from DeviceMatrix::groups_along")]
    InvalidGroups {
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// What is wrong with them.
        problem: GroupProblem,
    },

    /// A group of zero ranks was asked for.
    #[error("a group needs at least one rank, got {n}\nhint: pass the number of devices, e.g. 8")]
    NoRanks {
        /// The number of ranks that was given.
        n: usize,
    },

    /// The thread of a rank could not be started.
    #[error("could not start the thread of rank {rank}: {source}")]
    Spawn {
        /// The rank, counted in the world.
        rank: usize,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A buffer holds more elements than one MPI call can move.
    #[error("{op} on rank {rank}: {len} elements exceed MPI's count limit {max}\nhint: split the buffer into several calls")]
    TooLarge {
        /// The call (`all_reduce`, `send`, ...).
        op: &'static str,
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// Elements in the buffer.
        len: usize,
        /// The largest count one MPI call takes.
        max: usize,
    },

    /// A backend's collective gave a different result from the serial reference.
    #[error("conformance check failed on rank {rank}: {check}\n  {detail}\nhint: the backend's collective gave a result different from the serial reference")]
    Conformance {
        /// The rank that saw the problem, counted in the world.
        rank: usize,
        /// The check that failed, in words.
        check: String,
        /// What differed, in words.
        detail: String,
    },

    /// `mpirun` is not on `PATH`.
    #[error("mpirun not found: OpenMPI is not installed (or not on PATH)\n  searched PATH={path}\nhint: install OpenMPI: apt-get install openmpi-bin libopenmpi-dev (Fedora: dnf install openmpi openmpi-devel; macOS: brew install open-mpi)")]
    MpirunMissing {
        /// The `PATH` that was searched.
        path: String,
    },

    /// MPI is unavailable, an MPI call returned an error code, or ranks passed different groups to a split.
    #[error("MPI: {what}\nhint: {hint}")]
    Mpi {
        /// What went wrong, in words.
        what: String,
        /// How to fix it.
        hint: &'static str,
    },
}

/// Why a list of groups cannot be split into sub-communicators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupProblem {
    /// A group lists no rank.
    Empty {
        /// The group, counted from 0 in the list.
        index: usize,
    },
    /// A group names a rank the parent group lacks.
    OutOfRange {
        /// The group, counted from 0 in the list.
        index: usize,
        /// The rank it names, counted in the parent group.
        member: usize,
        /// Ranks in the parent group.
        size: usize,
    },
    /// A rank appears more than once across the groups.
    Duplicate {
        /// The rank, counted in the parent group.
        member: usize,
    },
}

impl fmt::Display for GroupProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupProblem::Empty { index } => write!(f, "group {index} is empty"),
            GroupProblem::OutOfRange { index, member, size } => {
                write!(f, "group {index} names rank {member}, but the parent group has {size} ranks")
            }
            GroupProblem::Duplicate { member } => write!(f, "rank {member} appears more than once"),
        }
    }
}

impl CommError {
    /// The rank this error is about: the failed rank for failures, else the rank that saw it.
    pub fn rank(&self) -> Option<usize> {
        match self {
            CommError::BufferSize { rank, .. }
            | CommError::DTypeMismatch { rank, .. }
            | CommError::RankOutOfRange { rank, .. }
            | CommError::SelfMessage { rank, .. }
            | CommError::TagOutOfRange { rank, .. }
            | CommError::Mismatch { rank, .. }
            | CommError::MixedParts { rank, .. }
            | CommError::PartsMismatch { rank, .. }
            | CommError::MessageMismatch { rank, .. }
            | CommError::PeerExited { rank, .. }
            | CommError::Timeout { rank, .. }
            | CommError::RankFailed { rank, .. }
            | CommError::InvalidGroups { rank, .. }
            | CommError::Spawn { rank, .. }
            | CommError::TooLarge { rank, .. }
            | CommError::Conformance { rank, .. } => Some(*rank),
            CommError::PeerFailed { failed_rank, .. } => Some(*failed_rank),
            CommError::NoRanks { .. } | CommError::Mpi { .. } | CommError::MpirunMissing { .. } => None,
        }
    }
}
