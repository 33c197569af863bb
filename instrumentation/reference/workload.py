"""A synthetic chat workload with the shape that makes prefix caching matter.

- a few shared system prompts, optionally followed by shared tool definitions;
- multi-turn continuations: a later turn repeats the whole earlier conversation;
- a long-context tail (a small share of requests carry thousands of words);
- unique user questions.

``shared_prefix`` (0..1) is the knob for how much prefix is shared: the probability that
a request opens with one of the shared system prompts (otherwise its system prompt is
unique). Words are synthetic (``w123``); nothing here is real content.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from tokenpath.config import AT_LEAST_ONE, ConfigError, check, validate_fields

DEFAULT_SEED = 7
DEFAULT_SHARED_PREFIX = 0.7

_SHARE = check(ge=0.0, le=1.0, message="must be between 0 and 1, got {value}")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    seed: int = DEFAULT_SEED
    shared_prefix: float = field(default=DEFAULT_SHARED_PREFIX, metadata=_SHARE)
    system_prompts: int = field(default=4, metadata=AT_LEAST_ONE)
    system_prompt_words: int = 400
    tool_definition_words: int = 300
    tool_share: float = field(default=0.5,  # of requests with a shared system prompt
                              metadata=_SHARE)
    multi_turn_share: float = field(default=0.25, metadata=_SHARE)
    long_context_share: float = field(default=0.05, metadata=_SHARE)
    long_context_words: tuple[int, int] = (2000, 5000)
    user_words: tuple[int, int] = (15, 150)
    max_tokens: tuple[int, int] = (16, 96)
    stream_share: float = field(default=0.9, metadata=_SHARE)
    conversation_memory: int = 64

    def validate(self) -> None:
        validate_fields(self)
        for key in ("long_context_words", "user_words", "max_tokens"):
            low, high = getattr(self, key)
            if not 1 <= low <= high:
                raise ConfigError(key, f"needs 1 <= low <= high, got {(low, high)}")


@dataclass(slots=True)
class WorkloadRequest:
    messages: list[dict[str, str]]
    max_tokens: int
    stream: bool
    kind: str  # "shared", "unique", "multi_turn", "long_context"


@dataclass(slots=True)
class _Conversation:
    messages: list[dict[str, str]] = field(default_factory=list)


class WorkloadGenerator:
    """Deterministic for a given config (seeded)."""

    def __init__(self, config: WorkloadConfig | None = None) -> None:
        self.config = config or WorkloadConfig()
        self.config.validate()
        self._rng = random.Random(self.config.seed)
        self._system_prompts = [self._words(self.config.system_prompt_words, f"s{i}")
                                for i in range(self.config.system_prompts)]
        self._tools = self._words(self.config.tool_definition_words, "tool")
        self._conversations: deque[_Conversation] = deque(maxlen=self.config.conversation_memory)
        self._serial = 0

    def __iter__(self) -> WorkloadGenerator:
        return self

    def __next__(self) -> WorkloadRequest:
        return self.next_request()

    def next_request(self) -> WorkloadRequest:
        cfg, rng = self.config, self._rng
        self._serial += 1
        max_tokens = rng.randint(*cfg.max_tokens)
        stream = rng.random() < cfg.stream_share
        if self._conversations and rng.random() < cfg.multi_turn_share:
            conversation = rng.choice(self._conversations)
            conversation.messages.append(
                {"role": "assistant", "content": self._words(rng.randint(10, 60), "a")})
            conversation.messages.append({"role": "user", "content": self._user_text()})
            return WorkloadRequest(list(conversation.messages), max_tokens, stream, "multi_turn")
        if rng.random() < cfg.shared_prefix:
            system = rng.choice(self._system_prompts)
            if rng.random() < cfg.tool_share:
                system = system + "\n" + self._tools
            kind = "shared"
        else:
            system = self._words(cfg.system_prompt_words, f"u{self._serial}")
            kind = "unique"
        user = self._user_text()
        if rng.random() < cfg.long_context_share:
            user = self._words(rng.randint(*cfg.long_context_words), f"doc{self._serial}") + \
                "\n" + user
            kind = "long_context"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self._conversations.append(_Conversation(list(messages)))
        return WorkloadRequest(messages, max_tokens, stream, kind)

    def _user_text(self) -> str:
        return self._words(self._rng.randint(*self.config.user_words), f"q{self._serial}")

    def _words(self, count: int, tag: str) -> str:
        rng = self._rng
        return " ".join(f"{tag}w{rng.randrange(1_000_000)}" for _ in range(count))


# The demo's workload (tokenpath demo), an agent platform's shape: a dozen shared system
# prompts of 1,500 words, half with 1,200 words of tool definitions, so that prefixes
# repeat across replicas and compete for KV memory; short answers; and a long-context tail
# of 6k-20k-token documents (the O(n^2) attention leak).
DEMO_WORKLOAD = WorkloadConfig(system_prompts=12, system_prompt_words=1_500,
                               tool_definition_words=1_200, long_context_share=0.06,
                               long_context_words=(6_000, 20_000), max_tokens=(16, 64))
