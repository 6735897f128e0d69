"""What a hostile attack on the engine's new surfaces found (the --tools file, the template
renderer, the scheduler's typed submit): each refused with an slm error, never a raw exception
or a stall."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slm.engine.prepare import prompt_ids
from slm.engine.request import GenerationRequest, ResponseFormat, Tools
from slm.engine.scheduler import Scheduler
from slm.errors import InvalidInput, ShuttingDown
from slm.model.chat import render_chat
from slm.model.template_sandbox import MAX_MESSAGE_CHARS

pytestmark = pytest.mark.hostile


@pytest.mark.parametrize("function", [
    {"name": "f", "description": "\ud800"},  # a lone surrogate: no UTF-8 text carries it
    {"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "maximum": float("nan")}}}},
    {"name": "f", "parameters": {"type": b"object"}},  # not JSON at all
], ids=["surrogate", "nan", "bytes"])
def test_tools_json_cannot_carry_are_refused_as_input(function):
    with pytest.raises(InvalidInput, match="tools is not JSON text"):
        Tools.of([{"type": "function", "function": function}])


def test_a_schema_with_a_non_finite_bound_is_refused_as_input():
    with pytest.raises(InvalidInput, match="not JSON text"):
        ResponseFormat.from_schema({"type": "number", "maximum": float("inf")})


def test_a_template_error_message_is_cut_to_a_line():
    with pytest.raises(InvalidInput) as refused:
        render_chat("{{ raise_exception('e' * 1000000) }}", [{"role": "user", "content": "hi"}], {})
    assert len(str(refused.value)) < MAX_MESSAGE_CHARS + 200
    assert str(refused.value).endswith("(cut)")


class _Untokenizable:
    """A tokenizer whose bound says 1 token per byte and that must never be asked to encode."""

    chat_template = "{{ 'x' * 100000 }}"
    special_tokens: dict = {}
    max_token_bytes = 1

    def control_texts(self):
        return []

    def min_tokens(self, text: str) -> int:
        return len(text.encode())

    def encode(self, *args, **kwargs):
        raise AssertionError("a prompt that cannot fit by its bytes was tokenized")

    encode_with_literals = encode


def test_a_rendered_prompt_too_long_for_the_context_is_refused_before_tokenizing():
    target = SimpleNamespace(tokenizer=_Untokenizable(), model=SimpleNamespace(cfg=SimpleNamespace(context_length=256)))
    with pytest.raises(InvalidInput, match="the context holds 256"):
        prompt_ids(target, GenerationRequest(messages=({"role": "user", "content": "hi"},)))


def test_submit_takes_a_request_on_a_staged_composition():
    scheduler = Scheduler()
    with pytest.raises(InvalidInput, match="GenerationRequest"):
        scheduler.submit(None, {"prompt": "hi"})
    with pytest.raises(InvalidInput, match="staged composition"):
        scheduler.submit("tq", GenerationRequest(prompt="hi"))


class _Staged:
    """Enough of a Target for the runtime check (the request never reaches it)."""

    id = "blake3:00"
    tokenizer = None
    model = None

    def memory_estimate(self, *args, **kwargs):
        raise AssertionError("a stopped scheduler prepared a request")


def test_submit_after_stop_is_shutting_down():
    scheduler = Scheduler()
    scheduler.stop()
    with pytest.raises(ShuttingDown):
        scheduler.submit(_Staged(), GenerationRequest(prompt="hi"))


def test_the_preparing_thread_takes_a_bounded_number_of_jobs():
    """Every request's text waits for the one preparing thread, and a /tokenize text may be as
    long as a body: without a bound, a flood of them queued there held every text in memory and
    put every generation's prompt behind them. Past max_batch + max_queue jobs: Busy (429)."""
    import asyncio
    import threading

    from slm.errors import Busy

    scheduler = Scheduler(max_batch=1, max_queue=1)
    release = threading.Event()

    async def flood():
        held = [asyncio.ensure_future(scheduler.call_preparing(release.wait, 30)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(Busy, match="retry shortly"):
            await scheduler.call_preparing(len, "refused")
        release.set()
        assert await asyncio.gather(*held) == [True, True]
        return await scheduler.call_preparing(len, "taken again")  # the jobs done are counted out

    try:
        assert asyncio.run(flood()) == len("taken again")
    finally:
        release.set()
        scheduler.stop()
