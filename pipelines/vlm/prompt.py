"""A prompt: its template, the JSON schema its answer must follow, its answer budget and its
system text; and the one way a request is built from it (:meth:`Prompt.request`).

Every request a stage sends is made here, so the schema, budget and system text that travel with
a prompt cannot be forgotten or mixed up at a call site, and every request names its prompt (for
costs per prompt, :class:`pipelines.vlm.metering.MeteredEngine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image

from pipelines.vlm.engine import VlmRequest


@dataclass(frozen=True)
class Prompt:
    """A prompt template (``str.format`` fields), the JSON schema of its answer, its answer budget
    in tokens and the system text it is sent with."""

    name: str
    template: str
    schema: dict | None
    max_tokens: int
    system: str | None = None

    def render(self, **fields: str) -> str:
        return self.template.format(**fields)

    def request(self, id: str, images: Sequence[Image.Image] = (), **fields: str) -> VlmRequest:
        """The request asking this prompt about ``images`` (shown before the text), ``fields``
        filled into the template; ``id`` is the caller's key, echoed in the response."""
        return VlmRequest(
            id,
            self.render(**fields),
            list(images),
            system=self.system,
            schema=self.schema,
            max_tokens=self.max_tokens,
            prompt_name=self.name,
        )
