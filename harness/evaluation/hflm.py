"""lm-eval's HFLM with its ``generate`` calls decoded by harness/model/decode.py (``eval.fast_decode``): the same
completions, token for token and RNG draw for draw, with less Python per decoding step. Registered with lm-eval as
``harness-hf``; ``harness.evaluation.driver`` picks it for the hf backend."""

from __future__ import annotations

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from harness.model.decode import generating_with_sample

MODEL_NAME = "harness-hf"


@register_model(MODEL_NAME)
class FastDecodeHFLM(HFLM):
    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        # lm-eval builds its stop-sequence criteria and calls self.model.generate(...): that call is decoded by
        # harness.model.decode.generate (plain generate where decode's rules say so)
        with generating_with_sample(self.model):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
