"""OpenAI's ``/v1/chat/completions`` and ``/v1/completions`` over REST: the call record of one
request (its sequences streamed side by side through the inference path) and how its steps are
sent, as one JSON answer or as server-sent events ending with ``[DONE]``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

from carpool.server.inference.call import Answer, Call, Withdrawal
from carpool.server.inference.outcomes import error_status
from carpool.server.inference.path import ClientGone, Inference
from carpool.server.openai.answers import Completion
from carpool.server.openai.codec import encode_error, model_name
from carpool.server.openai.generation import (
    Kind,
    Posted,
    Step,
    decode_generation,
    posted,
    row_parameters,
    step_of,
)
from carpool.server.rest.asgi import JSON, Send, send_response
from carpool.server.rest.calls import OPENAI
from carpool.server.rest.generate import EVENT_STREAM, event
from carpool.server.statuses import STOPPING, HTTPError, Status

__all__ = ["ROUTES", "answer_completion", "completion_call"]

ROUTES: dict[tuple[str, ...], Kind] = {("chat", "completions"): "chat", ("completions",): "text"}
Stepped = tuple[Posted, Step]  # one step, with the request it answers


def completion_call(
    kind: Kind,
    read_body: Callable[[], Awaitable[bytes]],
    withdrawn: Withdrawal,
    max_client_batch_size: int | None,
) -> Call[Posted, Stepped]:
    """One generation request (``kind``: chat or text); its body names the model."""

    async def read() -> Posted:
        return posted(await read_body(), kind)

    decode = partial(decode_generation, max_client_batch_size=max_client_batch_size)
    return Call(
        protocol=OPENAI, model=None, named=_named, read=read, decode=decode, encode=_encode,
        withdrawal=withdrawn, row_parameters=row_parameters,
    )  # fmt: skip


def _named(post: Posted) -> str:
    return model_name(post.doc)


def _encode(answer: Answer, post: Posted) -> Stepped:
    return post, step_of(answer, post)


async def answer_completion(inference: Inference, call: Call[Posted, Stepped], send: Send) -> int:
    """``call`` through ``inference``, answered whole or streamed as its body asks: the
    status sent. An error before the first event is raised (the app answers it in OpenAI's
    shape); after it, it is sent as an ``{"error": {...}}`` event that ends the stream."""
    sink = _Sink(send)
    try:
        await inference.stream(call, sink.emit)
    except ClientGone:
        return Status.CLIENT_CLOSED  # nobody to answer
    except (Exception, asyncio.CancelledError) as exc:
        if not sink.started:
            raise
        error = (
            HTTPError(Status.UNAVAILABLE, STOPPING)
            if isinstance(exc, asyncio.CancelledError)
            else error_status(exc)
        )
        last = event(encode_error(exc, error))
        await send({"type": "http.response.body", "body": last, "more_body": False})
        return Status.OK
    await sink.finish()
    return Status.OK


class _Sink:
    """Where a request's steps go: each chunk sent as it comes (a stream), or the steps
    kept until the whole answer is sent."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.completion: Completion | None = None

    async def emit(self, stepped: Stepped) -> None:
        post, step = stepped
        if self.completion is None:
            self.completion = Completion(post)
        if not self.completion.stream:
            self.completion.add(step)
            return
        chunks = self.completion.chunks(step)
        if chunks:
            await self._events(chunks, more=True)

    async def finish(self) -> None:
        completion = self.completion
        assert completion is not None, "a generation request has one step at least"
        if completion.stream:
            await self._events(completion.closing(), more=False)
        else:
            await send_response(self.send, Status.OK, completion.body(), JSON)

    async def _events(self, chunks: list[bytes], *, more: bool) -> None:
        if not self.started:
            self.started = True
            start = {"type": "http.response.start", "status": Status.OK, "headers": EVENT_STREAM}
            await self.send(start)
        body = b"".join(event(chunk) for chunk in chunks)
        await self.send({"type": "http.response.body", "body": body, "more_body": more})
