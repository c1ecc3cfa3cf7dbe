"""arbor_llm on SmolLM2-135M (skipped when it is not fetched, unless
ARBOR_REQUIRE_MODELS lists it): replies stream the model's greedy output,
a reply dropped or cancelled midway leaves the model as good as new, and
bad input raises arbor's exceptions."""

import os
import pathlib

import pytest

import arbor_llm

MODEL = "smollm2-135m"


def _fetched() -> bool:
    home = pathlib.Path(os.environ.get("ARBOR_HOME", pathlib.Path.home() / ".cache" / "arbor"))
    return (home / "models" / f"{MODEL}.gguf").exists()


needs_model = pytest.mark.skipif(
    not _fetched() and MODEL not in os.environ.get("ARBOR_REQUIRE_MODELS", ""),
    reason=f"{MODEL} is not fetched (arbor fetch {MODEL})",
)


@pytest.fixture(scope="module")
def model():
    return arbor_llm.Model(MODEL, max_tokens=24)


@needs_model
def test_pieces_make_up_the_reply(model):
    reply = model.generate("The three primary colours are")
    pieces = list(reply)
    done = reply.finish()
    assert len(pieces) > 1
    assert "".join(pieces) == done["text"]
    assert done["stats"]["generated_tokens"] == len(done["tokens"]) == 24
    assert done["stats"]["stop"] == "max_tokens"
    assert done["stats"]["tokens_per_second"] > 0
    # Greedy: the same prompt gives the same reply.
    assert model.generate("The three primary colours are").finish()["tokens"] == done["tokens"]


@needs_model
def test_chat_and_per_reply_limits(model):
    messages = [{"role": "user", "content": "Name a colour."}]
    short = model.chat(messages, max_tokens=3).finish()
    assert short["stats"]["generated_tokens"] <= 3
    full = model.chat(messages).finish()
    assert full["text"].startswith(short["text"])


@needs_model
def test_dropped_and_cancelled_replies_leave_the_model_as_new(model):
    messages = [{"role": "user", "content": "Count from one to twenty in words."}]
    whole = model.chat(messages).finish()
    reply = model.chat(messages)
    next(reply)
    del reply
    reply = model.chat(messages)
    first = next(reply)
    reply.cancel()
    cut = reply.finish()
    assert cut["stats"]["stop"] == "cancelled"
    assert cut["text"].startswith(first) and whole["text"].startswith(cut["text"])
    assert model.chat(messages).finish()["tokens"] == whole["tokens"]


def test_bad_input_raises_arbor_errors():
    with pytest.raises(arbor_llm.InvalidOptionError, match="temperature"):
        arbor_llm.Model("/nonexistent/model.gguf", temperature=-1.0)
    with pytest.raises(arbor_llm.InvalidOptionError, match="backend"):
        arbor_llm.Model("/nonexistent/model.gguf", backend="tpu")
    with pytest.raises(arbor_llm.ArborError):
        arbor_llm.Model("/nonexistent/model.gguf")
    assert issubclass(arbor_llm.InvalidOptionError, arbor_llm.ArborError)


@needs_model
def test_bad_messages_raise(model):
    with pytest.raises(arbor_llm.InvalidOptionError, match="role"):
        model.chat([{"role": "wizard", "content": "hi"}])
    with pytest.raises(arbor_llm.InvalidOptionError, match="content"):
        model.chat([{"role": "user"}])
    with pytest.raises(arbor_llm.InvalidOptionError, match="max_tokens"):
        model.generate("hi", max_tokens=0)
