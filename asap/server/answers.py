"""Building one request's answer from the engine's outputs: sample the first token(s), arrange choices,
encode them as one JSON body or as SSE chunks. Runs in the server's thread pool, never on the event loop.
"""
from __future__ import annotations

from dataclasses import dataclass

from asap.server import responses as R
from asap.server.requests import Job
from asap.server.sampling import sample
from asap.server.sse import event


def usage(job: Job) -> dict:
    return R.usage(sum(map(len, job.prompts)), len(job.prompts) * job.common.n * job.common.max_tokens)


@dataclass(frozen=True)
class Answer:
    rid: str
    model: str
    tokenizer: object | None
    max_response_mb: float

    def choices(self, job: Job, i: int, out) -> list[R.Choice]:
        """Prompt i's n choices: sampled tokens, echoed text, logprobs (echoed prompt's first)."""
        n, prompt, tok = job.common.n, job.prompts[i], self.tokenizer
        tokens = sample(out.logits, job.common.sampling, n) if job.common.max_tokens else []
        echo_text = ""
        if job.echo:
            echo_text = job.texts[i] if job.texts[i] is not None else (tok.decode(prompt) if tok is not None else "")
        echoed = R.prompt_logprobs(prompt, out.prompt_logprobs) if job.prompt_logprobs is not None else []
        choices = []
        for j in range(n):
            generated = [tokens[j]] if tokens else []
            text = echo_text + (R.token_text(tok, tokens[j]) if tokens and tok else "")
            logprobs = None
            if job.logprobs is not None:
                logprobs = echoed + [R.generated_logprob(out.logits, t, job.logprobs) for t in generated]
            choices.append(R.Choice(i * n + j, generated, text, logprobs))
        return choices

    def encode(self, job: Job, outs: list, kv: dict | None) -> bytes:
        """The whole answer as JSON bytes; 400 if it is over --max-response-mb after all."""
        choices = [c for i, out in enumerate(outs) for c in self.choices(job, i, out)]
        data = R.encode_body(job.kind, self.rid, self.model, choices, self.tokenizer, usage(job), kv)
        if len(data) > self.max_response_mb * 2**20:
            raise R.too_big(len(data), self.max_response_mb, measured=True)
        return data

    def events(self, job: Job, i: int, out, kv: dict | None) -> list[bytes]:
        """Prompt i's stream chunks, encoded; the KV hand-off rides on the last chunk before [DONE]
        (the usage chunk instead, when one follows)."""
        choices = self.choices(job, i, out)
        last = len(choices) - 1 if kv is not None and not job.common.include_usage else -1
        return [event(R.chunk(job.kind, self.rid, self.model, [c], self.tokenizer, None, job.common.include_usage,
                              kv if j == last else None)) for j, c in enumerate(choices)]
