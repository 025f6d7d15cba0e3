"""OpenAI's text generation answers, built from one request's steps as they come: its stream's
chunks (``chat.completion.chunk`` or ``text_completion``, a chat's choices opened by a role
chunk, the usage chunk when asked, ``[DONE]``), or its whole body at the end. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from carpool.server.openai.generation import Posted, Step

__all__ = ["DONE", "Completion"]

DONE = b"[DONE]"  # the data of a stream's last event


class Completion:
    """One request's answer, fed its steps in the order they came (several choices' steps
    interleave): OpenAI's chunks for each (:meth:`chunks`, :meth:`closing`) or the whole
    body (:meth:`body`). Usage counts a prompt's tokens once, however many choices it has."""

    def __init__(self, post: Posted) -> None:
        doc = post.doc
        self.post = post
        self.chat = post.kind == "chat"
        self.n: int = doc.get("n") or 1
        prompt = doc.get("prompt")
        prompts = len(prompt) if isinstance(prompt, list) else 1
        self.choices = prompts * self.n
        self.stream = doc.get("stream") is True
        options = doc.get("stream_options") or {}
        self.include_usage = self.stream and options.get("include_usage") is True
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._texts = [""] * self.choices
        self._reasons: list[str | None] = [None] * self.choices
        self._opened = False

    def add(self, step: Step) -> None:
        """``step`` counted and its text kept, for :meth:`body` and :meth:`closing`."""
        if step.index % self.n == 0:
            self.prompt_tokens += step.prompt_tokens
        self.completion_tokens += step.tokens
        self._texts[step.index] += step.text
        if step.finish_reason is not None:
            self._reasons[step.index] = step.finish_reason

    def chunks(self, step: Step) -> list[bytes]:
        """``step`` added, and the chunks it makes (none for a step whose text is held
        back, as it may begin a stop string). A chat's first step opens every choice first
        with its role, as OpenAI's streams do."""
        self.add(step)
        out = []
        if self.chat and not self._opened:
            self._opened = True
            role = {"role": "assistant", "content": ""}
            out = [self._chunk(self._choice(i, role, None)) for i in range(self.choices)]
        if step.text or step.finish_reason is not None:
            if self.chat:
                content = {"content": step.text} if step.text else {}
            else:
                content = {"text": step.text}
            out.append(self._chunk(self._choice(step.index, content, step.finish_reason)))
        return out

    def closing(self) -> list[bytes]:
        """The stream's last events: the usage chunk if asked for, then ``[DONE]``."""
        if not self.include_usage:
            return [DONE]
        usage = self._head(chunk=True)
        usage.update(choices=[], usage=self.usage())
        return [orjson.dumps(usage), DONE]

    def body(self) -> bytes:
        """The whole answer: every choice in index order, with the usage."""
        doc = self._head(chunk=False)
        doc["choices"] = [self._whole(i) for i in range(self.choices)]
        doc["usage"] = self.usage()
        return orjson.dumps(doc)

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }

    def _head(self, *, chunk: bool) -> dict[str, Any]:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        post = self.post
        return {"id": post.id, "object": kind, "created": post.created, "model": post.doc["model"]}

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        doc = self._head(chunk=True)
        doc["choices"] = [choice]
        if self.include_usage:
            doc["usage"] = None  # OpenAI's: null on every chunk but the last
        return orjson.dumps(doc)

    def _choice(self, index: int, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
        if self.chat:
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"index": index, **delta, "logprobs": None, "finish_reason": reason}

    def _whole(self, index: int) -> dict[str, Any]:
        text, reason = self._texts[index], self._reasons[index]
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}
        return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
