from __future__ import annotations

from tokenpath.instrumentation.reference.kv_cache import PagedKVCache
from tokenpath.instrumentation.reference.scheduler import (
    ContinuousBatchingScheduler,
    SchedulerConfig,
    Sequence,
)


def _token(seq: Sequence) -> int:
    return 7


def _scheduler(blocks: int = 64, block_tokens: int = 4, max_seqs: int = 8,
               budget: int = 64) -> ContinuousBatchingScheduler:
    return ContinuousBatchingScheduler(PagedKVCache(blocks, block_tokens),
                                       SchedulerConfig(max_seqs, budget))


def test_running_decodes_and_new_prefills_share_one_step() -> None:
    sched = _scheduler()
    a = Sequence("a", list(range(10)), max_tokens=3)
    sched.add(a)
    plan = sched.schedule()
    assert [c.seq for c in plan.prefills] == [a] and plan.decodes == []
    sched.complete_step(plan, _token)
    assert a.output_ids == [7] and not a.in_prefill  # first token at the end of prefill
    b = Sequence("b", list(range(100, 120)), max_tokens=2)
    sched.add(b)
    plan = sched.schedule()
    assert plan.decodes == [a]
    assert [c.seq for c in plan.prefills] == [b]
    assert plan.batch_size == 2 and plan.tokens == 1 + 20


def test_token_budget_chunks_a_long_prefill_across_steps() -> None:
    sched = _scheduler(budget=8)
    seq = Sequence("long", list(range(20)), max_tokens=1)
    sched.add(seq)
    chunks = []
    while not seq.finished:
        plan = sched.schedule()
        chunks.extend(c.new_tokens for c in plan.prefills)
        sched.complete_step(plan, _token)
    assert chunks == [8, 8, 4]
    assert seq.output_ids == [7]


def test_max_num_seqs_caps_the_batch_and_admission_is_fifo() -> None:
    sched = _scheduler(max_seqs=2)
    seqs = [Sequence(f"s{i}", [i] * 4, max_tokens=5) for i in range(4)]
    for seq in seqs:
        sched.add(seq)
    plan = sched.schedule()
    assert [c.seq.seq_id for c in plan.prefills] == ["s0", "s1"]
    assert list(sched.waiting) == seqs[2:]


def test_finished_sequences_free_their_blocks_and_let_waiting_ones_in() -> None:
    sched = _scheduler(blocks=2, block_tokens=4, max_seqs=4)
    a = Sequence("a", [1, 2, 3], max_tokens=1)
    b = Sequence("b", [4, 5, 6, 7, 8, 9], max_tokens=1)  # needs 2 blocks
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()
    assert [c.seq for c in plan.prefills] == [a]  # b does not fit yet
    finished = sched.complete_step(plan, _token)
    assert finished == [a]
    plan = sched.schedule()
    assert [c.seq for c in plan.prefills] == [b]


def test_prefix_cache_hits_skip_prefill_work() -> None:
    sched = _scheduler(block_tokens=4)
    first = Sequence("a", list(range(12)), max_tokens=1)
    sched.add(first)
    sched.complete_step(sched.schedule(), _token)
    second = Sequence("b", [*range(8), 40, 41, 42, 43], max_tokens=1)
    sched.add(second)
    plan = sched.schedule()
    (chunk,) = plan.prefills
    assert second.cached_tokens == 8
    assert chunk.new_tokens == 4 and chunk.context_before == 8


def test_a_decode_without_blocks_preempts_the_newest_sequence() -> None:
    sched = _scheduler(blocks=2, block_tokens=2, max_seqs=4, budget=64)
    a = Sequence("a", [1, 2], max_tokens=8)
    b = Sequence("b", [3, 4], max_tokens=8)
    sched.add(a)
    sched.add(b)
    sched.complete_step(sched.schedule(), _token)  # both prefilled, one block each, full
    plan = sched.schedule()  # each decode needs a new block: none free -> preempt b
    assert plan.decodes == [a]
    assert b.preemptions == 1 and list(sched.waiting) == [b]
    assert b.prompt_ids == [3, 4, 7]  # recomputed with its generated token


def test_a_sequence_that_fills_the_whole_cache_alone_is_finished_not_stuck() -> None:
    sched = _scheduler(blocks=2, block_tokens=2, max_seqs=4, budget=64)
    seq = Sequence("only", [1, 2, 3], max_tokens=10)  # 2 blocks, full after one token
    sched.add(seq)
    sched.complete_step(sched.schedule(), _token)
    assert seq.output_ids == [7]
    plan = sched.schedule()  # the next token needs a third block that does not exist
    assert plan.out_of_blocks == [seq] and plan.empty
    assert seq.finished and not sched.has_work
    assert sched.kv.free_blocks == 2
