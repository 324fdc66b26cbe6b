//! LocalComm against the serial reference: every collective, every element type, 1 to 8 ranks,
//! odd sizes, sub-groups; and bit-reproducibility for arbitrary inputs.

use autopar_comm::conformance::run_suite;
use autopar_comm::{reduce_serial, Buf, BufMut, Communicator, LocalComm, ReduceOp};

#[test]
fn every_collective_matches_the_serial_reference_on_1_to_8_ranks() {
    for n in 1..=8 {
        let checks = LocalComm::run(n, |comm| run_suite(&comm)).unwrap_or_else(|e| panic!("{n} ranks: {e}"));
        assert_eq!(checks.len(), n);
        assert!(checks.iter().all(|&c| c > 100), "{n} ranks: {checks:?}");
    }
}

fn noisy(rank: usize, len: usize) -> Vec<f32> {
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Values spanning many magnitudes, so the order of additions changes the bits.
            let m = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * 2f32.powi(((x >> 8) % 40) as i32 - 20)
        })
        .collect()
}

#[test]
fn all_reduce_is_the_rank_order_fold_bit_for_bit_and_repeats_exactly() {
    let (n, len) = (7, 100_003);
    let run = || {
        LocalComm::run(n, |comm| -> Result<Vec<f32>, autopar_comm::CommError> {
            let mut v = noisy(comm.rank(), len);
            comm.all_reduce((&mut v).into(), ReduceOp::Sum)?;
            Ok(v)
        })
        .unwrap()
    };
    let a = run();
    let b = run();
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| noisy(r, len)).collect();
    let want: Vec<u32> =
        (0..len).map(|i| reduce_serial(&inputs.iter().map(|v| v[i]).collect::<Vec<_>>(), ReduceOp::Sum).to_bits()).collect();
    // The fold in another order differs somewhere: the test can tell orders apart.
    let reversed: Vec<u32> =
        (0..len).map(|i| reduce_serial(&inputs.iter().rev().map(|v| v[i]).collect::<Vec<_>>(), ReduceOp::Sum).to_bits()).collect();
    assert_ne!(want, reversed);
    for r in 0..n {
        assert_eq!(a[r].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want, "rank {r}");
        assert_eq!(a[r].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b[r].iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }
}

#[test]
fn reduce_scatter_is_the_rank_order_fold_bit_for_bit() {
    let (n, block) = (5, 4099);
    let out = LocalComm::run(n, |comm| -> Result<Vec<f32>, autopar_comm::CommError> {
        let send = noisy(comm.rank(), block * n);
        let mut recv = vec![0f32; block];
        comm.reduce_scatter((&send).into(), (&mut recv).into(), ReduceOp::Mean)?;
        Ok(recv)
    })
    .unwrap();
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| noisy(r, block * n)).collect();
    for (r, got) in out.iter().enumerate() {
        for i in 0..block {
            let want = reduce_serial(&inputs.iter().map(|v| v[r * block + i]).collect::<Vec<_>>(), ReduceOp::Mean);
            assert_eq!(got[i].to_bits(), want.to_bits(), "rank {r} element {i}");
        }
    }
}

#[test]
fn a_communicator_works_as_a_trait_object_and_from_threads_of_your_own() {
    let comms = LocalComm::group(3).unwrap();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let comm: Box<dyn Communicator> = Box::new(c);
                let mut v = vec![comm.rank() as i64 + 1; 10];
                comm.all_reduce((&mut v).into(), ReduceOp::Prod).unwrap();
                v
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), vec![6i64; 10]);
    }
}

#[test]
fn empty_buffers_are_valid_for_every_collective() {
    LocalComm::run(3, |comm| -> Result<(), autopar_comm::CommError> {
        let mut empty: Vec<f64> = Vec::new();
        comm.all_reduce((&mut empty).into(), ReduceOp::Sum)?;
        comm.broadcast((&mut empty).into(), 2)?;
        let none: Vec<f64> = Vec::new();
        let mut recv: Vec<f64> = Vec::new();
        comm.all_gather((&none).into(), (&mut recv).into())?;
        comm.reduce_scatter((&none).into(), (&mut recv).into(), ReduceOp::Max)?;
        comm.all_to_all((&none).into(), (&mut recv).into())?;
        let peer = (comm.rank() + 1) % 3;
        comm.send((&none).into(), peer, 0)?;
        comm.recv((&mut recv).into(), (comm.rank() + 2) % 3, 0)?;
        Ok(())
    })
    .unwrap();
}

#[test]
fn more_ranks_than_cores_take_turns_on_the_cores() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let n = 2 * cores + 1;
    let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    LocalComm::run(n, |comm| -> Result<(), autopar_comm::CommError> {
        for round in 0..3 {
            // "Computing": counted while it lasts.
            let now = running.fetch_add(1, SeqCst) + 1;
            most.fetch_max(now, SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(10));
            running.fetch_sub(1, SeqCst);
            // Waiting: a point-to-point ring and a barrier give the core back.
            let (next, prev) = ((comm.rank() + 1) % n, (comm.rank() + n - 1) % n);
            comm.send(Buf::I64(&[round]), next, 7)?;
            let mut got = [0i64];
            comm.recv(BufMut::I64(&mut got), prev, 7)?;
            assert_eq!(got[0], round);
            comm.barrier()?;
        }
        Ok(())
    })
    .unwrap();
    let most = most.load(SeqCst);
    assert!(most <= cores, "{most} of {n} ranks computed at once on {cores} cores");
    assert!(most >= 1);
}

/// LocalComm seen through the trait's required methods only: the default (packed) calls of
/// parts, which MPI uses.
struct Defaults(LocalComm);

impl Communicator for Defaults {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn world_ranks(&self) -> &[usize] {
        self.0.world_ranks()
    }
    fn backend(&self) -> &'static str {
        "packed defaults over local"
    }
    fn all_reduce(&self, buf: BufMut<'_>, op: ReduceOp) -> autopar_comm::Result<()> {
        self.0.all_reduce(buf, op)
    }
    fn all_gather(&self, send: Buf<'_>, recv: BufMut<'_>) -> autopar_comm::Result<()> {
        self.0.all_gather(send, recv)
    }
    fn reduce_scatter(&self, send: Buf<'_>, recv: BufMut<'_>, op: ReduceOp) -> autopar_comm::Result<()> {
        self.0.reduce_scatter(send, recv, op)
    }
    fn broadcast(&self, buf: BufMut<'_>, root: usize) -> autopar_comm::Result<()> {
        self.0.broadcast(buf, root)
    }
    fn all_to_all(&self, send: Buf<'_>, recv: BufMut<'_>) -> autopar_comm::Result<()> {
        self.0.all_to_all(send, recv)
    }
    fn send(&self, buf: Buf<'_>, dest: usize, tag: u32) -> autopar_comm::Result<()> {
        self.0.send(buf, dest, tag)
    }
    fn recv(&self, buf: BufMut<'_>, src: usize, tag: u32) -> autopar_comm::Result<()> {
        self.0.recv(buf, src, tag)
    }
    fn barrier(&self) -> autopar_comm::Result<()> {
        self.0.barrier()
    }
    fn split(&self, groups: &[Vec<usize>]) -> autopar_comm::Result<Option<Box<dyn Communicator>>> {
        self.0.split(groups)
    }
}

#[test]
fn the_packed_default_calls_of_parts_match_the_serial_reference() {
    for n in [1, 3, 4] {
        let checks = LocalComm::run(n, |comm| run_suite(&Defaults(comm))).unwrap_or_else(|e| panic!("{n} ranks: {e}"));
        assert!(checks.iter().all(|&c| c > 100), "{n} ranks: {checks:?}");
    }
}
