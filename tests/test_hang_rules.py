"""The rules that tell a hang from other deaths across an attempt's rings (recovery.stuck_rank.attempt_hang), over
the slim metadata the real jobs of test_hang.py produce: the cases those jobs do not reach on CPU."""

from __future__ import annotations

from typing import Any

from blackbox.recovery.stuck_rank import attempt_hang

BACKWARD = "backward (where DDP all-reduces the gradients)"


def _ring(rank: int | None, pid: int, cause: str, collective: str | None = None, *, killer: int | None = 100,
          timed_out: str | None = None, last_seq: int | None = None) -> dict[str, Any]:  # fmt: skip
    hang = {"since": f"2026-01-01T00:00:0{rank or 0}.000000Z", "stalled_s": 30.0, "step": 20, "step_s": 0.05,
            "site": "wait_for_batch (train.py:7)", "stack": "main (train.py:9);wait_for_batch (train.py:7)",
            "collective": collective, "timed_out": timed_out}  # fmt: skip
    if last_seq is not None:
        hang["flight_recorder"] = {"file": f"/tmp/fr_{rank}", "groups": {"0": {"last_seq": last_seq,
                                                                              "last": "nccl:all_reduce"}}}  # fmt: skip
    death = {"cause": cause, "time": "2026-01-01T00:00:40.000000Z", "hang": hang,
             "killed_by": {"signal": "SIGTERM", "sender": "pt_elastic", "sender_pid": killer,
                           "time": "2026-01-01T00:00:40.000000Z"} if killer else None}  # fmt: skip
    return {"rank": rank, "host": "h", "pid": pid, "ppid": 100, "death": death}


def test_the_rank_stuck_outside_a_collective_is_first_and_the_waiters_collateral() -> None:
    rings = [_ring(0, 10, "hang", BACKWARD), _ring(1, 11, "hang"), _ring(2, 12, "hang", BACKWARD)]
    first, collateral, info = attempt_hang(rings)  # type: ignore[misc]
    assert first["rank"] == 1 and {m["rank"] for m in collateral} == {0, 2}
    assert [w["rank"] for w in info["waited"]] == [0, 2] and info["stuck_count"] == 1


def test_a_rank_that_died_of_its_own_exception_after_a_long_stall_is_no_hang() -> None:
    # rank 1 evaluated for minutes (no step) and raised; the others waited in a barrier until torchrun stopped them
    rings = [_ring(0, 10, "hang", "barrier"), _ring(1, 11, "exception", killer=None), _ring(2, 12, "hang", "barrier")]
    assert attempt_hang(rings) is None


def test_ranks_that_all_waited_in_collectives_name_no_stuck_rank_without_a_dump() -> None:
    assert attempt_hang([_ring(0, 10, "hang", BACKWARD), _ring(1, 11, "hang", BACKWARD)]) is None


def test_the_flight_recorder_names_the_rank_behind_where_every_stack_is_in_a_collective() -> None:
    # NCCL: the stuck rank's Python stack is in backward too (its kernel never launched the all-reduce)
    rings = [_ring(0, 10, "hang", BACKWARD, last_seq=26), _ring(1, 11, "hang", BACKWARD, last_seq=25),
             _ring(2, 12, "signal", BACKWARD, last_seq=26, timed_out="SIGABRT while it waited in a collective")]
    first, collateral, info = attempt_hang(rings)  # type: ignore[misc]
    assert first["rank"] == 1 and {m["rank"] for m in collateral} == {0, 2}
    fr = info["flight_recorder"]
    assert (fr["seq"], [e["rank"] for e in fr["entered"]], fr["behind"][0]["last_seq"]) == (26, [0, 2], 25)


def test_one_process_stuck_and_ended_by_timeout_is_a_hang_with_its_sender() -> None:
    ring = _ring(None, 10, "hang")
    ring["death"]["killed_by"] = {"signal": "SIGTERM", "sender": "timeout", "sender_pid": 9, "time": "t"}
    first, collateral, info = attempt_hang([ring])  # type: ignore[misc]
    assert first is ring and collateral == [] and info["waited"] == []
    assert [(c["sender"], c["sender_pid"], c["to_count"]) for c in info["chain"]] == [("timeout", 9, 1)]


def _killed_at(rank: int, pid: int, time: str) -> dict[str, Any]:
    """A rank SIGKILLed without a stall: no handler ran, its death's time is its last record's."""
    return {"rank": rank, "host": "h", "pid": pid, "ppid": 100,
            "death": {"cause": "killed", "time": time, "hang": None, "killed_by": None}}  # fmt: skip


def test_ranks_that_stalled_after_a_peer_was_killed_are_no_hang() -> None:
    # rank 1 SIGKILLed at step 20; rank 0 waited in backward, rank 2 (starved: no stack sample since its
    # last step) shows none; torchrun, slow under load, stopped them seconds later (the CI flake of test_ranks)
    rings = [_ring(0, 10, "hang", BACKWARD), _killed_at(1, 11, "2026-01-01T00:00:02.020000Z"), _ring(2, 12, "hang")]
    assert attempt_hang(rings) is None


def test_a_peer_killed_long_after_the_stall_began_leaves_the_hang() -> None:
    # rank 2 stuck from 00:00:02; rank 1, still stepping on another group, killed at the end like the rest
    rings = [_ring(0, 10, "hang", BACKWARD), _killed_at(1, 11, "2026-01-01T00:00:40.000000Z"), _ring(2, 12, "hang")]
    first, collateral, _ = attempt_hang(rings)  # type: ignore[misc]
    assert first["rank"] == 2 and {m["rank"] for m in collateral} == {0, 1}


# Folded stacks (outermost first) as the rings of a Pool job and of ranks hold them.
POOL_MAIN = ("<module> (/job/c4_pool.py:11);Pool.map (/usr/lib/python3.11/multiprocessing/pool.py:367);"
             "ApplyResult.wait (/usr/lib/python3.11/multiprocessing/pool.py:765);Condition.wait "
             "(/usr/lib/python3.11/threading.py:327)")  # fmt: skip
MP = "/usr/lib/python3.11/multiprocessing"
POOL_STUCK = (f"BaseProcess._bootstrap ({MP}/process.py:314);worker ({MP}/pool.py:125);mapstar ({MP}/pool.py:48);"
              "work (/job/c4_pool.py:4)")  # fmt: skip
POOL_IDLE = (f"BaseProcess._bootstrap ({MP}/process.py:314);worker ({MP}/pool.py:114);SimpleQueue.get "
             f"({MP}/queues.py:364);_ConnectionBase.recv_bytes ({MP}/connection.py:216)")  # fmt: skip
TORCH = "/venv/lib/python3.11/site-packages/torch"
OWN_BACKWARD = (f"<module> (/job/train.py:14);Tensor.backward ({TORCH}/_tensor.py:623);_engine_run_backward "
                f"({TORCH}/autograd/graph.py:979);BackwardCFunction.apply ({TORCH}/autograd/function.py:325);"
                "G.backward (/job/train.py:10)")  # fmt: skip
DDP_BACKWARD = f"<module> (/job/train.py:14);Tensor.backward ({TORCH}/_tensor.py:623);_engine_run_backward " \
               f"({TORCH}/autograd/graph.py:979)"  # fmt: skip


def test_a_rank_stuck_in_its_own_backward_is_not_waiting_in_ddps_all_reduce() -> None:
    from blackbox.recovery.hang import collective_of

    # a custom autograd Function's backward, the job's own code, under autograd's frames: stuck there, not waiting
    # (every rank of a job stuck so read as a waiter, and no hang was told)
    assert collective_of(DDP_BACKWARD, ranked=True) == BACKWARD
    assert collective_of(OWN_BACKWARD, ranked=True) is None


def test_a_pool_worker_stuck_in_its_task_is_the_first_death_and_the_processes_waiting_for_it_collateral() -> None:
    from blackbox.recovery.attempts import deaths
    from blackbox.recovery.hang import waits_for_others

    assert waits_for_others(POOL_MAIN) and waits_for_others(POOL_IDLE) and not waits_for_others(POOL_STUCK)

    # GIVEN a Pool job ended by timeout's SIGTERM: its main process hung at step 10 waiting for the map, one worker
    # stuck in the job's task (no steps of its own: the same stack for 20 s), the other idle on the task queue
    def ring(pid: int, cause: str, stack: str, step_s: float | None) -> dict[str, Any]:
        hang = {"since": "2026-01-01T00:00:02.000000Z", "stalled_s": 20.0, "step": 10 if step_s else None,
                "step_s": step_s, "site": stack.split(";")[-1], "stack": stack, "collective": None,
                "waits": waits_for_others(stack), "timed_out": None}  # fmt: skip
        killer = {"signal": "SIGTERM", "sender": "timeout", "sender_pid": 9, "time": "2026-01-01T00:00:22.000000Z"}
        role = "main process" if pid == 10 else "multiprocessing Pool worker"
        return {"rank": None, "host": "h", "pid": pid, "ppid": 10 if pid != 10 else 9,
                "death": {"cause": cause, "time": "2026-01-01T00:00:22.000000Z", "hang": hang, "killed_by": killer,
                          "victim": {"role": role, "pid": pid}}}  # fmt: skip
    main, stuck, idle = ring(10, "hang", POOL_MAIN, 0.05), ring(11, "signal", POOL_STUCK, None), ring(12, "signal",
                                                                                                    POOL_IDLE, None)
    # WHEN the attempt's deaths are read
    first, collateral, info = deaths([main, stuck, idle])
    # THEN the stuck worker is the first death, told as hung at the job's line, and the two others waited for it
    # (the main process was named, "stuck in <module>", the three lumped together)
    assert first is stuck and {m["pid"] for m in collateral} == {10, 12}, (first, collateral)
    assert stuck["death"]["cause"] == "hang" and "stuck in work (c4_pool.py:4)" in stuck["death"]["headline"]
    assert stuck["death"]["headline"].endswith("then SIGTERM from timeout ended it."), stuck["death"]["headline"]
    assert info is not None and [w["pid"] for w in info["waited"]] == [10, 12]


def test_a_sender_that_ended_before_it_was_named_is_told_by_its_pid() -> None:
    from blackbox.recovery.hang import hang_headline

    # `/bin/kill -TERM` is gone before the recorder reads its name: its pid and the signal stay (it read "then a
    # signal ended it")
    death = {"cause": "hang", "victim": {"role": "main process", "pid": 7},
             "killed_by": {"signal": "SIGTERM", "sender": None, "sender_pid": 2531, "time": "t"}}  # fmt: skip
    stall = {"stalled_s": 12.0, "step_s": 0.05, "site": "deadlock (c3_lock.py:8)", "collective": None}
    told = hang_headline(death, stall)
    assert told.endswith("stuck in deadlock (c3_lock.py:8); then SIGTERM from pid 2531 ended it."), told


def _before_steps(ring: dict[str, Any]) -> dict[str, Any]:
    """``ring`` stalled before it counted steps: its stack the same for 30 s (``hang._same_stack``)."""
    ring["death"]["hang"].update(step=None, step_s=None, longest_s=None, busy=None)
    return ring


def test_a_rank_at_one_stack_before_any_step_while_the_others_wait_in_a_collective_is_the_stuck_rank() -> None:
    from blackbox.recovery.attempts import deaths

    # GIVEN 3 ranks that count no steps yet: rank 1 at one line of its own for 30 s (its data preparation), ranks 0
    # and 2 in the barrier, all three SIGTERMed by torchrun (each alone: a place told, no hang called)
    rings = [_before_steps(_ring(r, 10 + r, "signal", None if r == 1 else "barrier")) for r in (0, 1, 2)]
    # WHEN the attempt's deaths are read
    first, collateral, info = deaths(rings)
    # THEN rank 1 hung, told so by the ranks that waited for it; "probable": no steps timed it (it read "ranks 0 to
    # 2 stopped by torchrun")
    assert first is rings[1] and {m["rank"] for m in collateral} == {0, 2}, first
    assert (first["death"]["cause"], first["death"]["confidence"]) == ("hang", "probable")
    assert "hung: the same stack for 30.0 s before the end, stuck in wait_for_batch (train.py:7)" in first["death"][
        "headline"]
    assert info is not None and [w["rank"] for w in info["waited"]] == [0, 2] and info["step_s"] is None


def test_a_rank_at_one_stack_before_any_step_is_no_hang_without_a_rank_waiting_in_a_collective() -> None:
    # rank 1 at one line and rank 0 somewhere else of its own, both SIGTERMed: nobody waited for anybody
    assert attempt_hang([_before_steps(_ring(0, 10, "signal")), _before_steps(_ring(1, 11, "signal"))]) is None
    # rank 1 at one line raised (its own error, after a long data preparation) while rank 0 waited in the barrier
    rings = [_before_steps(_ring(0, 10, "signal", "barrier")), _before_steps(_ring(1, 11, "exception", killer=None))]
    assert attempt_hang(rings) is None


def test_a_death_its_attempt_called_a_hang_takes_the_attempts_cause_and_a_hangs_levers() -> None:
    from blackbox.recovery.hang import as_decided

    ring = _before_steps(_ring(1, 11, "signal"))
    own = "look at wait_for_batch (train.py:7): the main thread was there in every stack sample for the last 30 s " \
          "before the end (waiting there, or looping on that one line)"  # fmt: skip
    death = {**ring["death"], "confidence": "certain", "headline": "ended by SIGTERM", "levers": [own, "other"]}
    decided = {"cause": "hang", "confidence": "probable", "headline": "The main process (pid 11) hung"}
    told = as_decided(death, decided, True)
    assert (told["cause"], told["confidence"], told["headline"]) == ("hang", "probable", decided["headline"])
    # (the place's lever keeps its hedge: without steps, a wait and a loop on one line look alike; a red team's rank
    # computing on one line read "stuck there (a data source, a lock, I/O)")
    assert told["levers"][0] == own and told["levers"].count(own) == 1 and told["levers"][-1] == "other", told
    assert any("collective timeout" in lever for lever in told["levers"])
    # a death its attempt left as it was, or one already a hang, is unchanged
    assert as_decided(death, {"cause": "signal"}, True) is death
    hung = {**death, "cause": "hang"}
    assert as_decided(hung, decided, True) is hung


def test_a_rank_at_one_stack_before_any_step_is_no_hang_while_another_rank_kept_moving() -> None:
    # rank 1 polls at one line for a file rank 0 is busy writing (its stack moving: no stall); rank 2 waits in the
    # barrier: the others may have waited for rank 0, not rank 1 (a red team's case read "rank 1 hung")
    rings = [_before_steps(_ring(r, 10 + r, "signal", "barrier" if r == 2 else None)) for r in (0, 1, 2)]
    rings[0]["death"]["hang"] = None
    assert attempt_hang(rings) is None


def test_two_ranks_at_one_stack_before_any_step_both_hung_and_a_waiter_that_lost_its_peer_says_so() -> None:
    from blackbox.recovery.attempts import deaths

    # GIVEN ranks 1 and 2 each at one line of its own, rank 0 in the barrier until gloo lost its peer, rank 3 too,
    # SIGTERMed by torchrun
    rings = [_before_steps(_ring(r, 10 + r, "signal", None if r in (1, 2) else "barrier")) for r in range(4)]
    rings[0]["death"].update(cause="exception", peer_lost="Connection closed by peer", killed_by=None)
    first, collateral, _ = deaths(rings)
    # THEN both hung (rank 2 kept "signal", "died of its own cause"), rank 0 lost its peer, rank 3 was stopped
    assert first is rings[1] and [m["death"]["cause"] for m in rings[1:3]] == ["hang", "hang"], rings[2]["death"]
    assert rings[2]["death"]["confidence"] == "probable" and "collateral_of" not in rings[2]["death"]
    assert rings[0]["death"]["collateral_of"] == {"rank": 1, "host": "h", "pid": 11, "by": None, "lost_peer": True}
    assert rings[3]["death"]["collateral_of"]["rank"] == 1 and "lost_peer" not in rings[3]["death"]["collateral_of"]
    assert {m["rank"] for m in collateral} == {0, 3}


def test_a_rank_waiting_in_init_process_group_is_said_to_wait_there_not_in_its_helper() -> None:
    from blackbox.recovery.hang import collective_of

    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    stack = (f"main (job.py:46);init_process_group ({c10d}:1899);_new_process_group_helper ({c10d}:2169);"
             f"_store_based_barrier ({c10d}:700)")  # fmt: skip
    assert collective_of(stack, True) == "init_process_group"
    assert collective_of(f"main (job.py:9);all_reduce ({c10d}:2800)", True) == "all_reduce"
    assert collective_of(f"main (job.py:9);_private_only ({c10d}:10)", True) == "_private_only"


def test_ranks_whose_handler_exited_0_on_the_ends_sigterm_are_read_for_a_hang() -> None:
    from blackbox.recovery.attempts import deaths

    # GIVEN 3 ranks before any step, each ending by its own handler's exit(0) on torchrun's SIGTERM: rank 1 at one
    # line of its own, ranks 0 and 2 in the barrier (clean exits: no deaths, so the hang was never looked for)
    rings = [_before_steps(_ring(r, 10 + r, "clean_exit", None if r == 1 else "barrier")) for r in (0, 1, 2)]
    for m in rings:
        m["death"]["handled_by"], m["death"]["killed_by"] = m["death"]["killed_by"], None
    first, collateral, info = deaths(rings)
    assert first is rings[1] and first["death"]["cause"] == "hang", first
    assert first["death"]["headline"].endswith("then SIGTERM from torchrun came at 2026-01-01T00:00:40.000000Z, and "
                                               "its own handler ended it."), first["death"]["headline"]
    assert {m["rank"] for m in collateral} == {0, 2} and info is not None
    # AND with no rank stalled, clean exits stay clean: no first death
    for m in rings:
        m["death"].update(cause="clean_exit", hang=None)
    assert deaths(rings)[0] is None


def test_ranks_whose_barrier_timed_out_waiting_for_a_rank_at_work_die_first_of_the_timeout() -> None:
    from blackbox.recovery.attempts import deaths

    # GIVEN rank 0 evaluating after step 20 (its stack moving: busy), ranks 1 and 2 whose barrier timed out waiting for
    # it (gloo's "Timed out waiting", their own exceptions), rank 0 then stopped by torchrun
    rings = [_ring(0, 10, "signal"), *(_ring(r, 10 + r, "exception", "barrier", killer=None,
                                              timed_out="RuntimeError: Timed out waiting 6000ms") for r in (1, 2))]
    rings[0]["death"]["hang"]["busy"] = True
    for m in rings[1:]:
        m["death"]["time"] = "2026-01-01T00:00:3{}.000000Z".format(m["rank"])
    first, collateral, info = deaths(rings)
    # THEN rank 1's timeout is the first death (it read rank 0's SIGTERM from torchrun), rank 0 stopped after it, and
    # the wait for rank 0 is told beside as busy, no hang
    assert first is rings[1] and [m["rank"] for m in collateral] == [0], (first, collateral)
    assert rings[0]["death"]["cause"] == "signal" and info is not None and info["busy"] is True
    assert [s["rank"] for s in info["stuck"]] == [0] and [w["rank"] for w in info["waited"]] == [1, 2]
    assert "_stuck" not in info


def test_ddps_forward_running_the_model_is_at_work_and_its_own_collectives_a_wait() -> None:
    from blackbox.recovery.hang import collective_of

    ddp = f"{TORCH}/nn/parallel/distributed.py"
    module = f"Module._call_impl ({TORCH}/nn/modules/module.py:1789)"
    forward = (f"<module> (/job/train.py:25);evaluate (/job/train.py:17);DistributedDataParallel._run_ddp_forward "
               f"({ddp}:1715)")
    # the model's forward under DDP's (an evaluation on rank 0 alone): its layers, a library's or the job's, at work
    assert collective_of(f"{forward};{module};Linear.forward ({TORCH}/nn/modules/linear.py:134)", True) is None
    assert collective_of(f"{forward};{module};Block.forward (/job/model.py:104)", True) is None
    # DDP's own wait before the forward (its buffers' broadcast): a collective
    assert collective_of(f"<module> (/job/train.py:25);DistributedDataParallel._sync_buffers ({ddp}:2100)", True) == \
        "DistributedDataParallel._sync_buffers (distributed.py:2100)"  # fmt: skip


def test_a_stalls_work_is_the_job_frame_every_sample_passed_through() -> None:
    from blackbox.recovery.hang import _common

    a = "<module> (/job/train.py:265);estimate_loss (/job/train.py:218);forward (/job/model.py:64)"
    b = "<module> (/job/train.py:265);estimate_loss (/job/train.py:219);item (/lib/python3.11/site-packages/x.py:3)"
    c = "<module> (/job/train.py:265);estimate_loss (/job/train.py:218);forward (/job/model.py:70)"
    assert _common([a, b]) == "estimate_loss (/job/train.py)"  # one function at two lines: its line dropped
    assert _common([a, c]) == "forward (/job/model.py)"  # the deepest the job's: the model's forward, at two lines
    assert _common([a]) == "forward (/job/model.py:64)"
    assert _common([a, "<module> (/job/other.py:1)"]) is None and _common([]) is None


def test_a_rank_really_stuck_beside_a_rank_at_work_is_the_hang_and_the_busy_one_at_work() -> None:
    from blackbox.recovery.attempts import deaths

    # GIVEN rank 0 evaluating since 00:00:00 (busy), rank 1 stuck on an event since 00:00:01, rank 2 in the barrier,
    # all three SIGTERMed by torchrun (it read "ranks 0 and 1 ... at work, no hang")
    rings = [_ring(0, 10, "signal"), _ring(1, 11, "hang"), _ring(2, 12, "hang", "barrier")]
    rings[0]["death"]["hang"]["busy"] = True
    first, collateral, info = deaths(rings)
    # THEN rank 1 hung, the first death; rank 0 at work meanwhile, collateral with the waiter
    assert first is rings[1] and first["death"]["cause"] == "hang", first
    assert info is not None and not info.get("busy") and [s["rank"] for s in info["stuck"]] == [1], info
    assert [w["rank"] for w in info["at_work"]] == [0] and {m["rank"] for m in collateral} == {0, 2}
    assert rings[0]["death"]["cause"] == "signal" and rings[0]["death"]["collateral_of"]["rank"] == 1


def test_a_rank_that_raised_after_a_pause_beside_a_rank_at_work_is_the_first_death_and_no_wait_is_told() -> None:
    from blackbox.recovery.attempts import deaths

    # GIVEN rank 0 evaluating (busy), rank 2 asleep 4 s and then raising (it read "ranks 0 and 2 ... at work")
    rings = [_ring(0, 10, "signal"), _ring(1, 11, "hang", "barrier"), _ring(2, 12, "exception", killer=None)]
    rings[0]["death"]["hang"]["busy"] = True
    rings[2]["death"]["time"] = "2026-01-01T00:00:35.000000Z"
    first, collateral, info = deaths(rings)
    assert first is rings[2] and info is None and {m["rank"] for m in collateral} == {0, 1}, (first, info)


def test_ranks_whose_handler_exits_0_when_a_time_limit_stops_torchrun_are_stopped_by_it() -> None:
    from blackbox.recovery.attempts import deaths

    # GIVEN timeout's SIGTERM to torchrun's agent (pid 100), which SIGTERMs its ranks at 00:00:40 and dies 2 s later,
    # waiting for them; each rank's handler saves and exits 0 (they read "3 ended cleanly", or one "graceful")
    agent = {"rank": None, "host": "h", "pid": 100, "ppid": 9, "death": {
        "cause": "signal", "time": "2026-01-01T00:00:42.000000Z", "hang": None,
        "killed_by": {"signal": "SIGTERM", "sender": "timeout", "sender_pid": 9, "time": "2026-01-01T00:00:39.9Z"}}}
    rings = [_ring(r, 10 + r, "clean_exit") for r in range(3)]
    for m in rings:
        m["death"].update(hang=None, handled_by=m["death"].pop("killed_by"))
    first, collateral, _ = deaths([agent, *rings])
    assert first is agent and {m["rank"] for m in collateral} == {0, 1, 2}, (first, collateral)
    assert all(m["death"]["collateral_of"]["pid"] == 100 for m in rings)


def test_ranks_that_waited_for_a_rank_at_work_are_no_hang_of_their_own() -> None:
    from blackbox.recovery.attempts import deaths
    from blackbox.recovery.hang import as_decided

    # GIVEN rank 0 at work (busy, in estimate_loss), ranks 1 and 2 a hang by their own stall in a barrier, all three
    # SIGTERMed by torchrun (ranks 1 and 2 read "hung" beside "Waiting for a rank at work: ... no hang")
    rings = [_ring(0, 10, "signal"), _ring(1, 11, "hang", "barrier"), _ring(2, 12, "hang", "barrier")]
    rings[0]["death"]["hang"].update(busy=True, work="estimate_loss (/job/train.py)")
    for m in rings:
        m["death"]["victim"] = {"role": "main process", "pid": m["pid"]}
    full = {**rings[1]["death"], "levers": ["find the rank that never entered the collective this one waited in (the "
                                            "job's other ranks)", "its own"]}  # fmt: skip
    _, _, info = deaths(rings)
    # THEN each is ended by the signal, waiting for rank 0, at work there; its full death says the same, without a
    # hang's levers
    assert info is not None and info["busy"] is True
    for m in rings[1:]:
        d = m["death"]
        assert (d["cause"], d["confidence"], d["waited_for"]["rank"]) == ("signal", "certain", 0), d
        assert d["headline"] == (f"The main process (pid {m['pid']}) was ended by SIGTERM from torchrun after it "
                                 "waited 30.0 s in barrier for rank 0, at work in estimate_loss (train.py): no hang of "
                                 "its own."), d["headline"]  # fmt: skip
    told = as_decided(full, rings[1]["death"], True)
    assert (told["cause"], told["levers"], told["waited_for"]["rank"]) == ("signal", ["its own"], 0), told


def test_a_rank_writing_its_distributed_checkpoint_shard_is_not_waiting() -> None:
    from blackbox.recovery.hang import collective_of

    dcp = f"{TORCH}/distributed/checkpoint"
    # rank 1 stuck opening its shard (a full disk, a hung mount): I/O, not a collective (it read as waiting in
    # FileSystem.create_stream, and no hang was told); DCP's own gathers go through distributed_c10d
    writing = (f"<module> (/job/dcp.py:13);save ({dcp}/state_dict_saver.py:180);_write_files_from_queue "
               f"({dcp}/filesystem.py:422);FileSystem.create_stream ({dcp}/filesystem.py:520);Path.open "
               "(/usr/lib/python3.11/pathlib.py:1044)")  # fmt: skip
    assert collective_of(writing, True) is None
    gathering = f"<module> (/job/dcp.py:13);save ({dcp}/state_dict_saver.py:180);all_gather ({TORCH}/distributed/" \
                "distributed_c10d.py:3000)"  # fmt: skip
    assert collective_of(gathering, True) == "all_gather"
