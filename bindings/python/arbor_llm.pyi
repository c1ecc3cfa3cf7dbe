"""arbor for Python: a model larger than the memory budget at close to a
small model's speed, with the large model's exact output."""

from typing import Iterator, List, Literal, Optional, TypedDict

__version__: str

class ArborError(Exception):
    """An error of arbor: a missing or corrupt model, a draft with another
    tokenizer, a budget too small to run, a prompt longer than the context."""

class InvalidOptionError(ArborError):
    """An option out of range (raised before anything loads)."""

class Message(TypedDict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str

class Stats(TypedDict):
    prompt_tokens: int
    generated_tokens: int
    prefill_seconds: float
    decode_seconds: float
    tokens_per_second: float
    tokens_per_pass: float
    streamed_bytes: int
    peak_memory: Optional[int]
    stop: Literal["max_tokens", "stop_token", "context_full", "cancelled"]

class Completion(TypedDict):
    text: str
    tokens: List[int]
    stats: Stats

class Reply(Iterator[str]):
    """Text pieces as the target confirms them. Dropping the reply or
    calling `cancel()` stops it within one forward pass."""
    def __iter__(self) -> "Reply": ...
    def __next__(self) -> str: ...
    def cancel(self) -> None: ...
    def finish(self) -> Completion:
        """Waits for the end; the text includes pieces already read."""
        ...

class Model:
    """A model (GGUF path or registered name such as ``"qwen2.5-coder-0.5b"``,
    fetched once into ``$ARBOR_HOME``) and optionally a draft; greedy by
    default. ``memory_budget`` is bytes for the whole process; ``strategy``
    is ``autoregressive``, ``chain``, ``tree``, ``tree-provisional``,
    ``ppd``, ``tree-ppd``, ``lookup`` or ``auto``."""
    def __init__(
        self,
        model: str,
        *,
        draft: Optional[str] = None,
        strategy: Optional[str] = None,
        memory_budget: Optional[int] = None,
        backend: Optional[str] = None,
        threads: Optional[int] = None,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        level: Optional[float] = None,
        context: Optional[int] = None,
    ) -> None: ...
    def generate(self, prompt: str, *, max_tokens: Optional[int] = None) -> Reply: ...
    def chat(self, messages: List[Message], *, max_tokens: Optional[int] = None) -> Reply: ...
    @property
    def strategy(self) -> str: ...
