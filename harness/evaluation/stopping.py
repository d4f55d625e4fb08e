"""lm-eval's stop-sequence criteria with the same decisions and less decoding.

lm-eval (0.4.13, ``lm_eval.models.utils_hf.stop_sequences_criteria``) stops a generate call with one
``MultiTokenEOSCriteria`` per stop string: at every step each decodes the last ``len(encode(stop)) + 2`` generated
tokens of every row of the batch and marks a row done once the stop string is in that text; the batch ends when all
rows are done for one of the stop strings (rows done for different strings do not add up). ``StopSequences`` keeps
that rule and decodes less: a row that is done stays done, so it is not decoded again, and a window of token ids is
decoded once per generate call (decoding is a function of the ids: rows that ended with EOS repeat the same window of
pad tokens at every later step). What is decoded goes through the same ``tokenizer.batch_decode`` call on a tensor
of windows, as in lm-eval.
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteria, StoppingCriteriaList


class StopSequences(StoppingCriteria):
    """Every stop string's done-tracker in one criterion; True (the whole batch ends) once all rows are done for one
    of them, as lm-eval's list of ``MultiTokenEOSCriteria`` decides."""

    def __init__(self, tokenizer, stops: list[str], initial_decoder_input_length: int, batch_size: int):
        self.tokenizer = tokenizer
        self.initial_decoder_input_length = initial_decoder_input_length
        # (stop string, tokens looked back: its encoding + 2 as lm-eval, done per row)
        self.trackers = [(stop, len(tokenizer.encode(stop, add_special_tokens=False)) + 2, [False] * batch_size)
                         for stop in stops]
        self.texts: dict[tuple[int, ...], str] = {}  # decoded windows of this generate call
        self.decoded_windows = 0  # windows decoded, of ...
        self.checked_windows = 0  # ... windows lm-eval would have decoded

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> bool:
        generated = input_ids[:, self.initial_decoder_input_length:]
        batch_done = False
        for stop, lookback, done in self.trackers:  # every tracker advances every step, as in lm-eval's list
            self.checked_windows += len(done)
            pending = [i for i, row_done in enumerate(done) if not row_done]
            if pending:
                for i, text in zip(pending, self._decoded(generated[pending, -lookback:]), strict=True):
                    done[i] = stop in text
            batch_done = batch_done or all(done)
        return batch_done

    def _decoded(self, windows: torch.Tensor) -> list[str]:
        keys = [tuple(row) for row in windows.tolist()]
        new = list(dict.fromkeys(key for key in keys if key not in self.texts))
        if new:
            texts = self.tokenizer.batch_decode(torch.tensor(new, dtype=windows.dtype, device=windows.device))
            self.texts.update(zip(new, texts, strict=True))
            self.decoded_windows += len(new)
        return [self.texts[key] for key in keys]


def stop_sequences_criteria(tokenizer, stops: list[str], initial_decoder_input_length: int,
                            batch_size: int) -> StoppingCriteriaList:
    """Drop-in for lm-eval's function of the same name (same arguments, same stopping decisions)."""
    return StoppingCriteriaList([StopSequences(tokenizer, stops, initial_decoder_input_length, batch_size)])
