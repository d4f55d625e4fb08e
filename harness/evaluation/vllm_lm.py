"""lm-eval's VLLM with a seed per request, so one engine serves every benchmark of a checkpoint (``harness-vllm``;
``harness.evaluation.driver`` picks it for the vllm backend).

lm-eval 0.4.13 builds one ``SamplingParams`` per request with no seed, so vLLM samples every request from the
engine's one generator: a request's tokens then depend on everything the engine sampled before it and on how the
scheduler batched it. Each benchmark therefore needed a fresh engine (start-up, weights, CUDA-graph capture every
time, and engines that were never torn down: the next one failed vLLM's free-memory check). Here each sampled
request carries its own seed (``request_seed``): a digest of the eval seed, the prompt's token ids, the sampling
settings and the request's occurrence among identical ones (lm-eval sends ``repeats`` copies of a request; each
copy is one of the k samples). vLLM then draws that request from its own generator, so a benchmark's samples are
the same whatever the engine did before, whatever runs beside it in the batch, and under data parallelism.

``release`` tears the engine down after the checkpoint's last benchmark (an eval process with several checkpoints,
``eval.job_scope=run``, builds one engine per checkpoint; vLLM's own start checks the device's free memory)."""

from __future__ import annotations

import gc
import hashlib
import json
from collections import Counter
from collections.abc import Sequence

from lm_eval.api.registry import register_model
from lm_eval.models.vllm_causallms import VLLM

MODEL_NAME = "harness-vllm"
SEED_BITS = 63  # torch.Generator.manual_seed takes any 64-bit value; 63 bits stay positive in every int type


def request_seed(eval_seed: int, prompt_token_ids: Sequence[int], settings: Sequence, occurrence: int) -> int:
    """The seed of one sampled request: stable across processes and runs (no Python ``hash``)."""
    key = json.dumps([eval_seed, list(prompt_token_ids), list(settings), occurrence]).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> (64 - SEED_BITS)


def sampling_settings(params) -> tuple:
    """What makes two requests with the same prompt different requests (greedy and sampled modes of a benchmark)."""
    return params.temperature, params.top_p, params.top_k, params.max_tokens, sorted(params.stop or [])


@register_model(MODEL_NAME)
class SeededVLLM(VLLM):
    def generate_until(self, requests, disable_tqdm: bool = False):
        self._occurrences = Counter()  # per call: a benchmark's requests, counted in lm-eval's fixed order
        return super().generate_until(requests, disable_tqdm)

    def _model_generate(self, requests, generate: bool = False, sampling_params=None):
        if generate:  # lm-eval's generate_until: one fresh SamplingParams per request
            for prompt_token_ids, params in zip(requests, sampling_params, strict=True):
                settings = sampling_settings(params)
                key = (tuple(prompt_token_ids), json.dumps(settings))
                params.seed = request_seed(self.model_args["seed"], prompt_token_ids, settings, self._occurrences[key])
                self._occurrences[key] += 1
        return super()._model_generate(requests, generate, sampling_params)

    def release(self) -> None:
        """Shut the engine down and free its memory (its engine-core process or in-process worker, the model
        parallel groups it created, the device's weights and KV cache): vLLM's own teardown between engines."""
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        engine, self.model = getattr(self, "model", None), None
        if engine is None:  # data_parallel_size > 1: lm-eval's ray replicas built and shut down their own engines
            return
        engine.llm_engine.engine_core.shutdown()  # vLLM 0.30: the client of the engine core (process or in-process)
        del engine
        gc.collect()
        cleanup_dist_env_and_memory()
