//! A failing rank never hangs the others: they get an error within seconds and the run names
//! the first failure and its rank. Wrong arguments get errors naming the rank and the facts.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use autopar_comm::{CommError, Communicator, LocalComm, LocalOptions, ReduceOp};

const QUICK: Duration = Duration::from_secs(5);

/// Run `n` ranks with a long timeout (so that only failure propagation can end the run
/// quickly), collecting what each rank's last collective returned.
fn run_and_collect<F>(n: usize, f: F) -> (Result<Vec<()>, CommError>, Vec<Option<String>>, Duration)
where
    F: Fn(&LocalComm) -> Result<(), CommError> + Sync,
{
    let seen: Mutex<Vec<Option<String>>> = Mutex::new(vec![None; n]);
    let start = Instant::now();
    let out = LocalComm::run_with(n, LocalOptions::default().timeout(Duration::from_secs(600)), |comm| {
        let r = f(&comm);
        if let Err(e) = &r {
            seen.lock().unwrap()[comm.rank()] = Some(e.to_string());
        }
        r
    });
    (out, seen.into_inner().unwrap(), start.elapsed())
}

#[test]
fn a_panicking_rank_fails_every_pending_collective_and_the_run_names_it() {
    let (out, seen, took) = run_and_collect(4, |comm| {
        if comm.rank() == 2 {
            std::thread::sleep(Duration::from_millis(200));
            panic!("boom on purpose");
        }
        let mut v = vec![1.0f32; 1000];
        comm.all_reduce((&mut v).into(), ReduceOp::Sum)
    });
    assert!(took < QUICK, "took {took:?}");
    match out {
        Err(CommError::RankFailed { rank: 2, message }) => assert!(message.contains("boom on purpose"), "{message}"),
        other => panic!("expected rank 2 to be reported, got {other:?}"),
    }
    for r in [0, 1, 3] {
        let e = seen[r].as_deref().expect("every other rank got an error");
        assert!(e.contains("rank 2 failed") && e.contains("boom on purpose"), "rank {r}: {e}");
    }
}

#[test]
fn a_rank_returning_an_error_fails_later_collectives_of_every_group() {
    let (out, seen, took) = run_and_collect(4, |comm| {
        let pair = comm.split(&[vec![0, 1], vec![2, 3]])?.expect("listed");
        if comm.rank() == 3 {
            return Err(CommError::RankFailed { rank: 3, message: "data file unreadable".into() });
        }
        // Ranks 0 and 1 keep working in their own sub-group, then join a world collective.
        let mut v = vec![1i32; 7];
        pair.all_reduce((&mut v).into(), ReduceOp::Sum)?;
        std::thread::sleep(Duration::from_millis(100));
        comm.barrier()
    });
    assert!(took < QUICK, "took {took:?}");
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("rank 3 failed") && msg.contains("data file unreadable"), "{msg}");
    for r in [0, 1, 2] {
        assert!(seen[r].as_deref().unwrap_or("").contains("data file unreadable"), "rank {r}: {:?}", seen[r]);
    }
}

#[test]
fn a_pending_recv_fails_when_its_sender_panics() {
    let (out, seen, took) = run_and_collect(2, |comm| {
        if comm.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
            panic!("sender died");
        }
        let mut buf = vec![0f64; 3];
        comm.recv((&mut buf).into(), 0, 5)
    });
    assert!(took < QUICK);
    assert!(matches!(out, Err(CommError::RankFailed { rank: 0, .. })));
    assert!(seen[1].as_deref().unwrap().contains("sender died"));
}

#[test]
fn a_rank_that_finishes_early_is_named_instead_of_hanging_its_peers() {
    let (out, seen, took) = run_and_collect(3, |comm| {
        if comm.rank() == 1 {
            return Ok(());
        }
        comm.barrier()
    });
    assert!(took < QUICK);
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("rank 1 finished its work without joining"), "{msg}");
    assert!(seen[0].is_some() && seen[2].is_some());
}

#[test]
fn ranks_that_wait_on_each_other_time_out_with_the_missing_rank() {
    let start = Instant::now();
    let out = LocalComm::run_with(2, LocalOptions::default().timeout(Duration::from_millis(300)), |comm| {
        let mut buf = vec![0i32; 1];
        comm.recv((&mut buf).into(), 1 - comm.rank(), 0)
    });
    assert!(start.elapsed() < QUICK);
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("timed out") && msg.contains("waiting for rank(s)"), "{msg}");
}

#[test]
fn different_collectives_on_different_ranks_are_a_mismatch_error() {
    let (out, seen, took) = run_and_collect(2, |comm| {
        let mut v = vec![0f32; 4];
        if comm.rank() == 0 {
            comm.all_reduce((&mut v).into(), ReduceOp::Sum)
        } else {
            comm.broadcast((&mut v).into(), 0)
        }
    });
    assert!(took < QUICK);
    assert!(out.is_err());
    for s in &seen {
        let s = s.as_deref().unwrap();
        assert!(s.contains("ranks called different collectives") && s.contains("all_reduce") && s.contains("broadcast"), "{s}");
    }
}

#[test]
fn buffers_of_different_lengths_on_different_ranks_are_a_mismatch_error() {
    let out = LocalComm::run(3, |comm| {
        let mut v = vec![0f32; 4 + comm.rank()];
        comm.all_reduce((&mut v).into(), ReduceOp::Max)
    });
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("ranks called different collectives") && msg.contains("4 elements"), "{msg}");
}

#[test]
fn parts_of_different_lengths_or_types_are_errors_on_every_rank() {
    // Same total, different split: every rank sees the mismatch and leaves the call.
    let (out, seen, took) = run_and_collect(3, |comm| {
        let mut v = [1f32; 10];
        let (a, b) = v.split_at_mut(if comm.rank() == 1 { 4 } else { 6 });
        comm.all_reduce_parts(&mut [a.into(), b.into()], ReduceOp::Sum)
    });
    assert!(took < QUICK, "{took:?}");
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("part 0 holds 4 elements on rank 1 but 6 on rank 0"), "{msg}");
    assert!(seen.iter().all(|s| s.as_deref().is_some_and(|s| s.contains("part 0 holds 4"))), "{seen:?}");
    // A plain all-reduce beside an all-reduce of parts of the same total: a mismatch.
    let out = LocalComm::run(2, |comm| {
        let mut v = [1f32; 4];
        if comm.rank() == 0 {
            comm.all_reduce((&mut v[..]).into(), ReduceOp::Sum)
        } else {
            comm.all_reduce_parts(&mut [(&mut v[..]).into()], ReduceOp::Sum)
        }
    });
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("ranks called different collectives") && msg.contains("all_reduce_parts"), "{msg}");
    // Parts of two element types in one call.
    let out = LocalComm::run(2, |comm| {
        let (mut a, mut b) = (vec![1f32; 3], vec![1f64; 3]);
        comm.all_reduce_parts(&mut [(&mut a).into(), (&mut b).into()], ReduceOp::Sum)
    });
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("part 1 is f64, part 0 is f32"), "{msg}");
}

#[test]
fn gathers_and_scatters_of_parts_check_their_parts_on_every_rank() {
    // Parts of different lengths on one rank (the same total): every rank sees the mismatch.
    let (out, seen, took) = run_and_collect(3, |comm| {
        let send = [1f32; 6];
        let (a, b) = send.split_at(if comm.rank() == 2 { 2 } else { 3 });
        let (mut ra, mut rb) = (vec![0f32; a.len() * 3], vec![0f32; b.len() * 3]);
        comm.all_gather_parts(&[a.into(), b.into()], &mut [(&mut ra).into(), (&mut rb).into()])
    });
    assert!(took < QUICK, "{took:?}");
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("all_gather_parts: part 0 holds 2 elements on rank 2 but 3 on rank 0"), "{msg}");
    assert!(seen.iter().all(|s| s.as_deref().is_some_and(|s| s.contains("part 0 holds 2"))), "{seen:?}");
    let (out, _, took) = run_and_collect(2, |comm| {
        let send = [1f64; 8];
        let (a, b) = send.split_at(if comm.rank() == 1 { 2 } else { 4 });
        let (mut ra, mut rb) = (vec![0f64; a.len() / 2], vec![0f64; b.len() / 2]);
        comm.reduce_scatter_parts(&[a.into(), b.into()], &mut [(&mut ra).into(), (&mut rb).into()], ReduceOp::Sum)
    });
    assert!(took < QUICK, "{took:?}");
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("reduce_scatter_parts: part 0 holds 2 elements on rank 1 but 4 on rank 0"), "{msg}");
    // A receive part of the wrong length, a send part that does not split, a missing part,
    // mixed types: errors naming the rank and the facts, before anything is exchanged.
    let fails = |f: &(dyn Fn(&LocalComm) -> Result<(), CommError> + Sync)| LocalComm::run(2, |comm| f(&comm)).unwrap_err().to_string();
    let send = vec![1f32; 3];
    let e = fails(&|comm| comm.all_gather_parts(&[(&send).into()], &mut [(&mut vec![0f32; 5]).into()]));
    assert!(e.contains("all_gather_parts on rank") && e.contains("receive part holds 5 elements, expected 6"), "{e}");
    let e = fails(&|comm| comm.reduce_scatter_parts(&[(&send).into()], &mut [(&mut vec![0f32; 1]).into()], ReduceOp::Sum));
    assert!(e.contains("reduce_scatter_parts on rank") && e.contains("multiple of the group size"), "{e}");
    let e = fails(&|comm| comm.all_gather_parts(&[(&send).into()], &mut []));
    assert!(e.contains("list of receive parts holds 0 elements, expected 1"), "{e}");
    let wide = vec![1f64; 3];
    let e = fails(&|comm| {
        let mut r = (vec![0f32; 6], vec![0f64; 6]);
        comm.all_gather_parts(&[(&send).into(), (&wide).into()], &mut [(&mut r.0).into(), (&mut r.1).into()])
    });
    assert!(e.contains("part 1 is f64, part 0 is f32"), "{e}");
}

#[test]
fn a_wrong_receive_buffer_names_the_rank_and_the_expected_length() {
    let out = LocalComm::run(4, |comm| {
        let send = vec![1.0f32; 3];
        let mut recv = vec![0f32; if comm.rank() == 2 { 11 } else { 12 }];
        comm.all_gather((&send).into(), (&mut recv).into())
    });
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("rank 2 failed") && msg.contains("holds 11 elements, expected 12"), "{msg}");
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let out = LocalComm::run(2, |comm| -> Result<(), String> {
        let mut v = vec![0f32; 4];
        let e = comm.broadcast((&mut v).into(), 2).unwrap_err().to_string();
        assert!(e.contains("root 2 is not in this group of 2 ranks"), "{e}");
        let e = comm.send((&v).into(), comm.rank(), 0).unwrap_err().to_string();
        assert!(e.contains("cannot send to or receive from itself"), "{e}");
        let e = comm.send((&v).into(), 1 - comm.rank(), 40_000).unwrap_err().to_string();
        assert!(e.contains("tag 40000"), "{e}");
        let send = vec![0i32; 4];
        let e = comm.all_gather((&send).into(), (&mut v).into()).unwrap_err().to_string();
        assert!(e.contains("send buffer is i32, receive buffer is f32"), "{e}");
        let mut odd = [0f32; 5];
        let e = comm.all_to_all((&v[..1]).into(), (&mut odd[..1]).into()).unwrap_err().to_string();
        assert!(e.contains("multiple of the group size"), "{e}");
        let e = comm.split(&[vec![0, 0]]).unwrap_err().to_string();
        assert!(e.contains("rank 0 appears more than once"), "{e}");
        Ok(())
    });
    out.unwrap();
}

#[test]
fn a_message_of_the_wrong_type_or_length_is_reported_with_both() {
    let out = LocalComm::run(2, |comm| -> Result<(), CommError> {
        if comm.rank() == 0 {
            comm.send((&vec![1.0f32; 3]).into(), 1, 9)?;
            comm.barrier()
        } else {
            let mut buf = vec![0f64; 3];
            let e = comm.recv((&mut buf).into(), 0, 9).unwrap_err().to_string();
            assert!(e.contains("holds 3 f32 elements, expected 3 f64"), "{e}");
            comm.barrier()
        }
    });
    out.unwrap();
}

#[test]
fn ranks_passing_different_group_lists_to_split_get_an_error() {
    let out = LocalComm::run(2, |comm| {
        let groups = if comm.rank() == 0 { vec![vec![0, 1]] } else { vec![vec![1, 0]] };
        comm.split(&groups).map(|_| ())
    });
    let msg = out.unwrap_err().to_string();
    assert!(msg.contains("ranks called different collectives") && msg.contains("split"), "{msg}");
}
