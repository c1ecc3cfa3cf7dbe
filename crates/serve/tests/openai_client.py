"""The official `openai` Python client against `arbor serve`.

Run by `cargo test -p arbor-serve --test all openai_client::`, which starts the
servers and passes their addresses:
  ARBOR_MAIN  a server over SmolLM2 (or a tiny random model), with that
              same model loaded as a draft, a queue of 4 and API key
              ARBOR_KEY;
  ARBOR_SLOW  a server over a slower random model with a queue of 1 and
              no key, for the full-queue test.
"""

import json
import os
import threading
import time
import unittest
import urllib.request

import openai
from openai import OpenAI

MAIN = os.environ["ARBOR_MAIN"]
SLOW = os.environ["ARBOR_SLOW"]
KEY = os.environ["ARBOR_KEY"]


def client(addr, key=KEY):
    return OpenAI(base_url=f"http://{addr}/v1", api_key=key, max_retries=0, timeout=120)


def model_id(c):
    return c.models.list().data[0].id


def metric(addr, name):
    text = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(f"arbor_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colours."},
]


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = client(MAIN)
        cls.model = model_id(cls.c)

    def chat(self, **kw):
        args = dict(model=self.model, messages=MESSAGES, temperature=0, max_tokens=16)
        args.update(kw)
        return self.c.chat.completions.create(**args)

    def streamed(self, **kw):
        text, finish, usage, ids = "", None, None, set()
        for chunk in self.chat(stream=True, **kw):
            ids.add(chunk.id)
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        self.assertEqual(len(ids), 1, "one id in every chunk")
        return text, finish, usage

    def test_whole_and_streamed_chat_agree(self):
        whole = self.chat()
        self.assertEqual(whole.object, "chat.completion")
        self.assertEqual(whole.choices[0].message.role, "assistant")
        text, finish, usage = self.streamed(stream_options={"include_usage": True})
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(finish, whole.choices[0].finish_reason)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens)
        self.assertLessEqual(whole.usage.completion_tokens, 16)

    def test_text_completions(self):
        whole = self.c.completions.create(model=self.model, prompt="The sky is", max_tokens=8, temperature=0)
        streamed = "".join(
            c.choices[0].text
            for c in self.c.completions.create(
                model=self.model, prompt="The sky is", max_tokens=8, temperature=0, stream=True
            )
            if c.choices
        )
        self.assertEqual(streamed, whole.choices[0].text)

    def test_stop_sequences(self):
        free = self.chat(max_tokens=24).choices[0].message.content
        self.assertGreaterEqual(len(free), 6, free)
        stop = free[len(free) // 2 : len(free) // 2 + 2]
        cut = free.index(stop)
        stopped = self.chat(max_tokens=24, stop=[stop])
        self.assertEqual(stopped.choices[0].message.content, free[:cut])
        self.assertEqual(stopped.choices[0].finish_reason, "stop")
        text, finish, _ = self.streamed(max_tokens=24, stop=stop)
        self.assertEqual((text, finish), (free[:cut], "stop"))

    def test_a_draft_changes_nothing_at_temperature_0(self):
        plain = self.chat(max_tokens=24).choices[0].message.content
        for strategy in ["chain", "tree"]:
            drafted = self.chat(max_tokens=24, extra_body={"arbor": {"strategy": strategy}})
            self.assertEqual(drafted.choices[0].message.content, plain, strategy)

    def test_logprobs_and_penalties(self):
        r = self.chat(logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for e in content:
            self.assertEqual(len(e.top_logprobs), 3)
            self.assertLessEqual(e.logprob, 0.0)
            # Greedy: the chosen token is the most probable one.
            self.assertEqual(e.token, e.top_logprobs[0].token)
        self.assertEqual(b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace"),
                         r.choices[0].message.content)
        # A bias steers the answer; penalties with it give the same answer
        # whatever the strategy.
        ask = urllib.request.Request(
            f"http://{MAIN}/tokenize", data=json.dumps({"content": " cat"}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        cat = json.loads(urllib.request.urlopen(ask).read())["tokens"][-1]
        steered = self.chat(max_tokens=6, logit_bias={str(cat): 100})
        text = steered.choices[0].message.content
        self.assertEqual(text, text[: len(text) // 6] * 6)
        self.assertTrue(text)
        shaped = dict(max_tokens=24, frequency_penalty=1.5, presence_penalty=1, logit_bias={str(cat): 8})
        tired = self.chat(**shaped).choices[0].message.content
        for strategy in ["chain", "tree"]:
            drafted = self.chat(**shaped, extra_body={"arbor": {"strategy": strategy}})
            self.assertEqual(drafted.choices[0].message.content, tired, strategy)
        with self.assertRaises(openai.BadRequestError):
            self.chat(logit_bias={"not-a-token": 5})

    def test_errors(self):
        with self.assertRaises(openai.BadRequestError):
            self.chat(max_tokens=0)
        with self.assertRaises(openai.BadRequestError):
            self.chat(temperature=5)
        with self.assertRaises(openai.BadRequestError):
            self.chat(messages=[])
        with self.assertRaises(openai.NotFoundError):
            self.chat(model="no-such-model")
        with self.assertRaises(openai.AuthenticationError):
            client(MAIN, key="wrong").models.list()

    def test_two_concurrent_streams(self):
        want = self.chat(max_tokens=12).choices[0].message.content
        got = [None, None]

        def run(i):
            got[i] = self.streamed(max_tokens=12)[0]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(got, [want, want])

    def test_a_client_that_leaves_mid_stream(self):
        before = metric(MAIN, "requests_cancelled_total")
        stream = self.chat(max_tokens=200, stream=True)
        seen = 0
        for chunk in stream:
            seen += 1
            if seen == 3:
                break
        stream.close()
        # The server notices and stops; then it serves the next request.
        deadline = time.time() + 60
        while metric(MAIN, "requests_cancelled_total") == before and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(metric(MAIN, "requests_cancelled_total"), before + 1)
        self.assertEqual(self.chat(max_tokens=4).object, "chat.completion")


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                   "properties": {"city": {"type": "string", "maxLength": 30}}}}}]
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


class ToolsAndStructuredOutput(unittest.TestCase):
    """Tool calls and JSON schemas through the client's own types (the
    mechanics: SmolLM2's answers may be poor, the constraint keeps them
    well formed)."""

    @classmethod
    def setUpClass(cls):
        cls.c = client(MAIN)
        cls.model = model_id(cls.c)

    def test_a_forced_call_round_trip(self):
        choice = {"type": "function", "function": {"name": "get_weather"}}
        r = self.c.chat.completions.create(
            model=self.model, messages=WEATHER_QUESTION, tools=WEATHER, tool_choice=choice,
            temperature=0, max_tokens=48)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        call = r.choices[0].message.tool_calls[0]
        self.assertEqual(call.function.name, "get_weather")
        args = json.loads(call.function.arguments)
        self.assertIsInstance(args.get("city"), str)
        # Streamed: the same call, assembled from deltas.
        name, arguments, finish = "", "", None
        for chunk in self.c.chat.completions.create(
                model=self.model, messages=WEATHER_QUESTION, tools=WEATHER, tool_choice=choice,
                temperature=0, max_tokens=48, stream=True):
            if not chunk.choices:
                continue
            for d in chunk.choices[0].delta.tool_calls or []:
                name += d.function.name or ""
                arguments += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual((name, json.loads(arguments), finish), ("get_weather", args, "tool_calls"))
        # The result goes back; the next turn is an answer.
        follow = WEATHER_QUESTION + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'},
        ]
        r = self.c.chat.completions.create(
            model=self.model, messages=follow, tools=WEATHER, tool_choice="none",
            temperature=0, max_tokens=16)
        self.assertEqual(r.choices[0].message.tool_calls, None)
        self.assertTrue(r.choices[0].message.content)

    def test_json_schema_answers_parse(self):
        schema = {"type": "object", "additionalProperties": False, "required": ["name", "legs"],
                  "properties": {"name": {"type": "string", "maxLength": 20},
                                 "legs": {"type": "integer", "minimum": 0, "maximum": 8}}}
        r = self.c.chat.completions.create(
            model=self.model, temperature=0, max_tokens=64,
            messages=[{"role": "user", "content": "Describe a spider."}],
            response_format={"type": "json_schema", "json_schema": {"name": "animal", "schema": schema}})
        v = json.loads(r.choices[0].message.content)
        self.assertEqual(sorted(v), ["legs", "name"])
        self.assertTrue(0 <= v["legs"] <= 8)
        with self.assertRaises(openai.BadRequestError) as e:
            self.c.chat.completions.create(
                model=self.model, messages=WEATHER_QUESTION, max_tokens=4,
                extra_body={"repetition_penalty": 1.2})
        self.assertEqual(e.exception.body["param"], "repetition_penalty")


class FullQueue(unittest.TestCase):
    def test_a_full_queue_is_a_rate_limit_error(self):
        c = client(SLOW, key="anything")
        model = model_id(c)
        long = c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "go"}], max_tokens=400, stream=True
        )
        next(iter(long))  # the role chunk: queued
        # The server's test harness holds the first pass, so the worker keeps
        # the long request once it has taken it (the queue is empty again).
        deadline = time.time() + 60
        while metric(SLOW, "queue_depth") > 0 and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(metric(SLOW, "queue_depth"), 0, "the worker took the long request")
        outcome = []
        waiting = threading.Thread(
            target=lambda: outcome.append(
                c.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "next"}], max_tokens=2
                )
            )
        )
        waiting.start()
        while metric(SLOW, "queue_depth") < 1 and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(metric(SLOW, "queue_depth"), 1, "the second request waits")
        with self.assertRaises(openai.RateLimitError):
            c.chat.completions.create(model=model, messages=[{"role": "user", "content": "third"}], max_tokens=2)
        long.close()
        waiting.join()
        self.assertEqual(len(outcome), 1, "the waiting request was served")


if __name__ == "__main__":
    unittest.main(verbosity=2)
