"""lm-eval's HFLM with its ``generate`` calls decoded by harness/model/decode.py and its stop sequences checked by
harness/evaluation/stopping.py (``eval.fast_decode``): the same completions, token for token and RNG draw for draw,
with less Python per decoding step. Registered with lm-eval as ``harness-hf``; ``harness.evaluation.driver`` picks
it for the hf backend."""

from __future__ import annotations

from unittest.mock import patch

import lm_eval.models.huggingface as lm_eval_hf
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from harness.evaluation.stopping import stop_sequences_criteria
from harness.model.decode import generating_with_sample

MODEL_NAME = "harness-hf"


def harness_stop_sequences():
    """HFLM._model_generate builds its criteria with the module's ``stop_sequences_criteria`` (lm-eval 0.4.13; pinned
    in tests/test_stopping.py): for the call, that name is the drop-in with the same decisions."""
    return patch.object(lm_eval_hf, "stop_sequences_criteria", stop_sequences_criteria)


@register_model(MODEL_NAME)
class FastDecodeHFLM(HFLM):
    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        # lm-eval builds its stop-sequence criteria and calls self.model.generate(...): that call is decoded by
        # harness.model.decode.generate (plain generate where decode's rules say so)
        with generating_with_sample(self.model), harness_stop_sequences():
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
