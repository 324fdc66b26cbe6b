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
    pub op: &'static str,
    pub seq: u64,
    pub dtype: Option<DType>,
    pub send_len: usize,
    pub recv_len: usize,
    pub reduce: Option<crate::dtype::ReduceOp>,
    pub root: usize,
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
    #[error("{op} on rank {rank}: {what} holds {got} elements, expected {expected}\nhint: {hint}")]
    BufferSize { op: &'static str, rank: usize, what: &'static str, got: usize, expected: usize, hint: &'static str },

    #[error("{op} on rank {rank}: send buffer is {send}, receive buffer is {recv}\nhint: both buffers of one call must have the same element type")]
    DTypeMismatch { op: &'static str, rank: usize, send: DType, recv: DType },

    #[error("{op} on rank {rank}: {what} {peer} is not in this group of {size} ranks\nhint: ranks inside a group count from 0 to {size} - 1; use the group's own ranks, not global ones")]
    RankOutOfRange { op: &'static str, rank: usize, what: &'static str, peer: usize, size: usize },

    #[error("{op} on rank {rank}: a rank cannot send to or receive from itself\nhint: copy the buffer locally instead")]
    SelfMessage { op: &'static str, rank: usize },

    #[error("{op} on rank {rank}: tag {tag} is above the largest portable tag {max}\nhint: use tags from 0 to {max}")]
    TagOutOfRange { op: &'static str, rank: usize, tag: u32, max: u32 },

    #[error("ranks called different collectives\n  rank {rank}: {mine}\n  rank {peer}: {theirs}\nhint: every rank of a group must call the same collectives in the same order, with the same element type, sizes, operation and root")]
    Mismatch { rank: usize, peer: usize, mine: Box<CallDesc>, theirs: Box<CallDesc> },

    #[error("recv on rank {rank} from rank {src} tag {tag}: message holds {got_len} {got_dtype} elements, expected {expected_len} {expected_dtype}\nhint: sender and receiver must agree on the element type and length of each tagged message")]
    MessageMismatch { rank: usize, src: usize, tag: u32, expected_len: usize, expected_dtype: DType, got_len: usize, got_dtype: DType },

    #[error("{op} on rank {rank} stopped: rank {failed_rank} failed\n  {message}\nhint: the first failure is the cause; the other ranks stop with this error")]
    PeerFailed { op: &'static str, rank: usize, failed_rank: usize, message: String },

    #[error("{op} on rank {rank} cannot complete: rank {peer} finished its work without joining it\nhint: every rank of a group must call the same collectives; check for a rank-dependent early return")]
    PeerExited { op: &'static str, rank: usize, peer: usize },

    #[error("{op} on rank {rank} timed out after {waited_s:.1} s waiting for rank(s) {missing:?}\nhint: a rank is stuck or skipped this call; raise the timeout with LocalOptions::timeout if a rank legitimately needs longer")]
    Timeout { op: &'static str, rank: usize, waited_s: f64, missing: Vec<usize> },

    #[error("rank {rank} failed\n  {message}")]
    RankFailed { rank: usize, message: String },

    #[error("split on rank {rank}: invalid groups: {problem}\nhint: groups are lists of ranks of the parent group, non-empty, each rank in at most one group, e.g. from DeviceMatrix::groups_along")]
    InvalidGroups { rank: usize, problem: GroupProblem },

    #[error("a group needs at least one rank, got {n}\nhint: pass the number of devices, e.g. 8")]
    NoRanks { n: usize },

    #[error("could not start the thread of rank {rank}: {source}")]
    Spawn { rank: usize, source: std::io::Error },

    #[error("{op} on rank {rank}: {len} elements exceed MPI's count limit {max}\nhint: split the buffer into several calls")]
    TooLarge { op: &'static str, rank: usize, len: usize, max: usize },

    #[error("conformance check failed on rank {rank}: {check}\n  {detail}\nhint: the backend's collective gave a result different from the serial reference")]
    Conformance { rank: usize, check: String, detail: String },

    #[error("mpirun not found: OpenMPI is not installed (or not on PATH)\n  searched PATH={path}\nhint: install OpenMPI: apt-get install openmpi-bin libopenmpi-dev (Fedora: dnf install openmpi openmpi-devel; macOS: brew install open-mpi)")]
    MpirunMissing { path: String },

    #[error("MPI: {what}\nhint: {hint}")]
    Mpi { what: String, hint: &'static str },
}

/// Why a list of groups cannot be split into sub-communicators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupProblem {
    Empty { index: usize },
    OutOfRange { index: usize, member: usize, size: usize },
    Duplicate { member: usize },
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
