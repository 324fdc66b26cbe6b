//! [`Metered`]: any communicator, counting what it is asked to send. Every call records its
//! kind, its group (world ranks, ascending) and the bytes of the buffer the rank hands over
//! (the send buffer; the in-place buffer of all-reduce and broadcast; nothing for recv).
//! Sub-communicators from [`Communicator::split`] record into the same log. Used to check the
//! planner's predicted communication against what a step really does.

use std::sync::{Arc, Mutex};

use crate::comm::Communicator;
use crate::dtype::{Buf, BufMut, ReduceOp};
use crate::error::Result;

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeteredCall {
    /// `all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all`, `broadcast`, `send`, `recv`.
    pub kind: &'static str,
    /// World ranks of the group, ascending.
    pub group: Vec<usize>,
    /// Bytes of the buffer the rank handed over (the send buffer, or the in-place buffer of all-reduce and broadcast; 0 for recv).
    pub bytes: usize,
}

/// A communicator that records every collective and point-to-point call.
pub struct Metered {
    inner: Box<dyn Communicator>,
    log: Arc<Mutex<Vec<MeteredCall>>>,
}

impl Metered {
    /// Wrap `inner`; calls are appended to `log`.
    pub fn new(inner: Box<dyn Communicator>, log: Arc<Mutex<Vec<MeteredCall>>>) -> Self {
        Self { inner, log }
    }

    /// The calls recorded so far (by this communicator and every group split from it).
    pub fn calls(&self) -> Vec<MeteredCall> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Forget the calls recorded so far.
    pub fn clear(&self) {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn record(&self, kind: &'static str, bytes: usize) {
        let mut group = self.inner.world_ranks().to_vec();
        group.sort_unstable();
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push(MeteredCall { kind, group, bytes });
    }
}

impl Communicator for Metered {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn world_ranks(&self) -> &[usize] {
        self.inner.world_ranks()
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn all_reduce(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.record("all_reduce", buf.byte_len());
        self.inner.all_reduce(buf, op)
    }
    fn all_reduce_parts(&self, parts: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
        self.record("all_reduce", parts.iter().map(BufMut::byte_len).sum());
        self.inner.all_reduce_parts(parts, op)
    }
    fn all_gather(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<()> {
        self.record("all_gather", send.byte_len());
        self.inner.all_gather(send, recv)
    }
    fn all_gather_parts(&self, send: &[Buf<'_>], recv: &mut [BufMut<'_>]) -> Result<()> {
        self.record("all_gather", send.iter().map(Buf::byte_len).sum());
        self.inner.all_gather_parts(send, recv)
    }
    fn reduce_scatter(&self, send: Buf<'_>, recv: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.record("reduce_scatter", send.byte_len());
        self.inner.reduce_scatter(send, recv, op)
    }
    fn reduce_scatter_parts(&self, send: &[Buf<'_>], recv: &mut [BufMut<'_>], op: ReduceOp) -> Result<()> {
        self.record("reduce_scatter", send.iter().map(Buf::byte_len).sum());
        self.inner.reduce_scatter_parts(send, recv, op)
    }
    fn broadcast(&self, buf: BufMut<'_>, root: usize) -> Result<()> {
        self.record("broadcast", buf.byte_len());
        self.inner.broadcast(buf, root)
    }
    fn all_to_all(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<()> {
        self.record("all_to_all", send.byte_len());
        self.inner.all_to_all(send, recv)
    }
    fn send(&self, buf: Buf<'_>, dest: usize, tag: u32) -> Result<()> {
        self.record("send", buf.byte_len());
        self.inner.send(buf, dest, tag)
    }
    fn recv(&self, buf: BufMut<'_>, src: usize, tag: u32) -> Result<()> {
        self.record("recv", 0);
        self.inner.recv(buf, src, tag)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn split(&self, groups: &[Vec<usize>]) -> Result<Option<Box<dyn Communicator>>> {
        Ok(self.inner.split(groups)?.map(|sub| Box::new(Metered { inner: sub, log: self.log.clone() }) as Box<dyn Communicator>))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalComm;

    #[test]
    fn every_call_is_recorded_with_its_world_group_and_payload() {
        let calls = LocalComm::run(4, |comm| -> Result<Vec<MeteredCall>> {
            let m = Metered::new(Box::new(comm), Arc::new(Mutex::new(Vec::new())));
            let mut v = vec![1.0f32; 6];
            m.all_reduce((&mut v).into(), ReduceOp::Sum)?;
            let sub = m.split(&[vec![0, 2], vec![1, 3]])?.expect("every rank is in a group");
            let send = vec![1.0f64; 3];
            let mut recv = vec![0.0f64; 6];
            sub.all_gather((&send).into(), (&mut recv).into())?;
            Ok(m.calls())
        })
        .unwrap();
        assert_eq!(calls[1][0], MeteredCall { kind: "all_reduce", group: vec![0, 1, 2, 3], bytes: 24 });
        assert_eq!(calls[1][1], MeteredCall { kind: "all_gather", group: vec![1, 3], bytes: 24 });
        assert_eq!(calls[2][1].group, vec![0, 2]);
    }
}
