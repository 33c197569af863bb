from __future__ import annotations

from collections import Counter

import pytest

from tokenpath.config import ConfigError
from tokenpath.instrumentation.reference.server import ChatMessage, chat_template
from tokenpath.instrumentation.reference.tokenizer import ToyTokenizer
from tokenpath.instrumentation.reference.workload import WorkloadConfig, WorkloadGenerator


def _kinds(shared: float, n: int = 400) -> Counter[str]:
    generator = WorkloadGenerator(WorkloadConfig(shared_prefix=shared, seed=3))
    return Counter(generator.next_request().kind for _ in range(n))


def test_same_seed_same_workload() -> None:
    a = [WorkloadGenerator(WorkloadConfig(seed=5)).next_request().messages for _ in range(3)]
    b = [WorkloadGenerator(WorkloadConfig(seed=5)).next_request().messages for _ in range(3)]
    assert a == b


def test_shared_prefix_knob_moves_requests_from_unique_to_shared() -> None:
    low, high = _kinds(0.1), _kinds(0.9)
    assert high["shared"] > 3 * low["shared"]
    assert low["unique"] > 3 * high["unique"]
    assert _kinds(0.0)["shared"] == 0


def test_multi_turn_continuations_repeat_the_whole_conversation_as_prefix() -> None:
    generator = WorkloadGenerator(WorkloadConfig(multi_turn_share=1.0, seed=2))
    first = generator.next_request()
    follow = generator.next_request()
    assert follow.kind == "multi_turn"
    tokenizer = ToyTokenizer()
    a = tokenizer.encode(chat_template([ChatMessage(**m) for m in first.messages]))
    b = tokenizer.encode(chat_template([ChatMessage(**m) for m in follow.messages]))
    assert b[: len(a)] == a and len(b) > len(a)


def test_long_context_tail() -> None:
    generator = WorkloadGenerator(WorkloadConfig(long_context_share=1.0, multi_turn_share=0.0))
    request = generator.next_request()
    assert request.kind == "long_context"
    assert len(request.messages[1]["content"].split()) >= 2000


def test_invalid_share_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        WorkloadConfig(shared_prefix=1.5).validate()
    assert info.value.key == "shared_prefix"
