"""Prompting through the model's chat template, or a plain-text template for base models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from semrl.config.sections import DataConfig


@dataclass(frozen=True)
class PromptFormat:
    """How a problem becomes a prompt: the chat template with ``system_prompt`` (None: no system
    turn), or the plain-text ``template`` with a ``{problem}`` field (``data.prompt_template``, for
    base models)."""

    system_prompt: str | None = None
    template: str | None = None

    @classmethod
    def of(cls, data: DataConfig) -> PromptFormat:
        """The format of a config's ``data`` section (``data.system_prompt``, ``data.prompt_template``)."""
        return cls(data.system_prompt, data.prompt_template)

    def ids(self, tokenizer: PreTrainedTokenizerBase, problem: str) -> list[int]:
        """Token ids of ``problem``'s prompt (``build_prompt_ids``)."""
        return build_prompt_ids(tokenizer, problem, self.system_prompt, self.template)


def build_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, problem: str, system_prompt: str | None, template: str | None = None
) -> list[int]:
    """Token ids of ``[system], user: problem`` with the assistant turn opened; with ``template``
    (data.prompt_template, for base models) the plain text ``template.format(problem=problem)``."""
    if template is not None:
        return cast("list[int]", tokenizer(template.format(problem=problem))["input_ids"])
    messages = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": problem})
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return cast("list[int]", tokenizer(text, add_special_tokens=False)["input_ids"])
    # A base model without a template: plain text with the instruction in front.
    text = (system_prompt + "\n\n" if system_prompt else "") + f"Problem: {problem}\nSolution:"
    return cast("list[int]", tokenizer(text)["input_ids"])
