"""The engine flags a run replays with: one set, shared by the CLI, the replay pool and the
report."""

from __future__ import annotations

from dataclasses import dataclass

from cache_models.config import SglangConfig, TimeModel, VllmConfig


@dataclass(frozen=True)
class ReplaySettings:
    """The engine flags a run replays with (one set shared by the CLI and the report)."""

    block_size: int = 16
    page_size: int = 1
    capacity_tokens: int | None = None
    eviction_policy: str = "lru"
    chunked_prefill_size: int = 0
    # Requests in flight at once; 1 = sequential (each request finishes before the next).
    max_in_flight: int = 1
    # Replay in arrival time with this service-time model (needs timestamps); None = by order.
    time_model: TimeModel | None = None
    # vLLM --max-num-batched-tokens (None: no per-step budget) and --long-prefill-token-threshold.
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int = 0
    # SGLang: False = --disable-overlap-schedule; the --radix-eviction-policy-config parameters.
    overlap_schedule: bool = True
    slru_protected_threshold: int = 2
    tlru_threshold: int = 0
    tlru_next_prompt_estimate: int = 0
    # The engine defaults this run assumed, in words, for the report ("" when none).
    assumed_defaults: str = ""

    def vllm(self) -> VllmConfig:
        return VllmConfig(
            block_size=self.block_size,
            capacity_tokens=self.capacity_tokens,
            max_in_flight=self.max_in_flight,
            time_model=self.time_model,
            max_num_batched_tokens=self.max_num_batched_tokens,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
        )

    def sglang(self, page_size: int | None = None) -> SglangConfig:
        return SglangConfig(
            page_size=self.page_size if page_size is None else page_size,
            capacity_tokens=self.capacity_tokens,
            eviction_policy=self.eviction_policy,  # type: ignore[arg-type]
            chunked_prefill_size=self.chunked_prefill_size,
            max_in_flight=self.max_in_flight,
            time_model=self.time_model,
            overlap_schedule=self.overlap_schedule,
            slru_protected_threshold=self.slru_protected_threshold,
            tlru_threshold=self.tlru_threshold,
            tlru_next_prompt_estimate=self.tlru_next_prompt_estimate,
        )

    @property
    def sequential(self) -> bool:
        """Each request finishes before the next starts: nothing is in flight between two
        requests, so the replay can go chunk by chunk (streamed)."""
        return self.max_in_flight == 1 and self.time_model is None

    @property
    def engines(self) -> tuple[str, ...]:
        """The caches the report replays: both engines, and SGLang at page size 1 (the alignment
        loss) when its page is larger."""
        return ("vllm", "sglang") + (("sglang_page1",) if self.page_size != 1 else ())

    @property
    def mode(self) -> str:
        """The replay mode in words, for the report."""
        assumed = f"; {self.assumed_defaults}" if self.assumed_defaults else ""
        if self.time_model is not None:
            return (
                f"arrival time (up to {self.max_in_flight} in flight; prefill "
                f"{self.time_model.prefill_tokens_per_s:g} tokens/s, decode "
                f"{self.time_model.decode_tokens_per_s:g} tokens/s per request){assumed}"
            )
        if self.max_in_flight > 1:
            budget = self.max_num_batched_tokens
            per_step = f", {budget} tokens per step" if budget else ""
            return (
                f"concurrent (up to {self.max_in_flight} in flight, lock-step{per_step}){assumed}"
            )
        return f"sequential{assumed}"
