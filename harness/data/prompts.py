"""Prompt templates, one function used by both training and evaluation so the two see identical text.

Templates (by name, chosen in the preset's ``prompt_template``):
- ``tiny``: the synthetic arithmetic format, ``Q: <problem>\\n``; the model answers with worked steps and
  ``Answer: <n>``.
- ``qwen_boxed``: the Qwen-math system prompt used by Dr.GRPO / KTAE / GMTS evaluation.
- ``plain_8020``: the plain "User:/Assistant:" template of the 80/20 paper (§5.2).
- ``chat``: the model's own chat template with the boxed instruction in the user turn.
"""

from __future__ import annotations

from harness.config.choices import PROMPT_TEMPLATES  # _FORMATS below and "chat"

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

_FORMATS = {
    "tiny": "Q: {problem}\n",
    "qwen_boxed": ("<|im_start|>system\n" + BOXED_INSTRUCTION + "<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n"
                   "<|im_start|>assistant\n"),
    "plain_8020": "User:\n{problem}\n" + BOXED_INSTRUCTION + "\n\nAssistant:\n",
}


def render_prompt(template: str, problem: str, tokenizer=None) -> str:
    """The exact prompt text for ``problem``; ``chat`` needs the model's tokenizer."""
    if template == "chat":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("prompt_template 'chat' needs a tokenizer with a chat template")
        messages = [{"role": "user", "content": f"{problem}\n{BOXED_INSTRUCTION}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if template not in _FORMATS:
        raise ValueError(f"prompt_template must be one of {list(PROMPT_TEMPLATES)}, got {template!r}")
    return _FORMATS[template].replace("{problem}", problem)

# Stop strings per template for generation (the tokenizer's EOS always stops too; lm-eval adds it). The tiny
# template's answers span several lines ("12+34=46\n46-5=41\nAnswer: 41" then EOS), so never stop on "\n" there;
# "\nQ:" only catches a model that runs on into a new question. Chat-style templates end the turn with <|im_end|>.
STOP_SEQUENCES: dict[str, tuple[str, ...]] = {
    "tiny": ("\nQ:",),
    "qwen_boxed": ("<|im_end|>", "<|endoftext|>"),
    "plain_8020": ("\nUser:",),
    "chat": (),  # the model's own EOS / end-of-turn token
}


def stop_sequences(template: str, stop: list[str] | None) -> tuple[str, ...]:
    """The stop strings of an evaluation: ``eval.stop`` when set (``[]``: only the model's EOS), else the template's."""
    return tuple(stop) if stop is not None else STOP_SEQUENCES.get(template, ())
