"""Engine arithmetic written once, for the readable references and the numba kernels alike: small
``@njit`` functions, callable from Python (scalars or arrays) and from compiled code (sizes are
validated positive by the configs, so the numpy error model skips the division checks).

vLLM: ``Scheduler.schedule`` / ``KVCacheManager.allocate_slots`` (vllm/v1/core); SGLang:
``PrefillAdder`` (sglang/srt/managers/schedule_policy.py) and the overlap scheduler's release.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, error_model="numpy")
def ceil_div(a, b):  # type: ignore[no-untyped-def]
    """Whole blocks or pages of ``b`` tokens that ``a`` tokens take."""
    return -(-a // b)


@njit(cache=True, error_model="numpy")
def vllm_peak_tokens(prompt_len, output_len):  # type: ignore[no-untyped-def]
    """Tokens whose KV a vLLM request holds at its peak: the prompt and every output but the last
    (decode never computes the last output's KV)."""
    return prompt_len + output_len - 1


@njit(cache=True, error_model="numpy")
def vllm_step_threshold(threshold, eligible):  # type: ignore[no-untyped-def]
    """``Scheduler.schedule``'s --long-prefill-token-threshold for one step: it only applies while
    more than one request is running or waiting (``eligible``), else 0 (off)."""
    return threshold if eligible > 1 else 0


@njit(cache=True, error_model="numpy")
def vllm_chunk(remaining, threshold, budget_left):  # type: ignore[no-untyped-def]
    """``Scheduler.schedule``'s tokens for one request: its ``remaining`` ones, capped by a
    positive threshold (--long-prefill-token-threshold), then by the step's budget left."""
    if 0 < threshold < remaining:
        remaining = threshold
    return min(remaining, budget_left)


@njit(cache=True, error_model="numpy")
def sglang_kv_steps(output_len, stop_finish, overlap_schedule):  # type: ignore[no-untyped-def]
    """SGLang decode steps that compute KV: all N outputs after a stop under the overlap scheduler
    (one more step was in flight: ``Scheduler._reqs_finishing_inflight``), N - 1 after
    ``max_tokens`` or with ``--disable-overlap-schedule``."""
    return output_len - 1 + (stop_finish & overlap_schedule)


@njit(cache=True, error_model="numpy")
def sglang_match_limit(prompt_len, hit_limit):  # type: ignore[no-untyped-def]
    """``Req._compute_max_prefix_len``: L-1, capped by ``logprob_start_len`` (``hit_limit``, -1:
    none) for a request with ``return_logprob``."""
    limit = prompt_len - 1
    return min(limit, hit_limit) if hit_limit >= 0 else limit


@njit(cache=True, error_model="numpy")
def sglang_split_priority(priority):  # type: ignore[no-untyped-def]
    """The prompt split's insert priority: +1, saturating at int64's maximum
    (``UnifiedRadixCache``)."""
    return min(priority, 2**63 - 2) + 1


@njit(cache=True, error_model="numpy")
def never_fits(kv_tokens, unit, usable_units):  # type: ignore[no-untyped-def]
    """A request whose own KV at its peak, in whole ``unit``s, exceeds the whole cache
    (``usable_units`` < 0: unbounded): the engine refuses it."""
    return usable_units >= 0 and ceil_div(kv_tokens, unit) > usable_units


@njit(cache=True, error_model="numpy")
def chunk_end(start, prompt_len, chunk, page_size, first):  # type: ignore[no-untyped-def]
    """Where the prefill chunk starting at ``start`` ends (SGLang's PrefillAdder with
    ``--chunked-prefill-size`` ``chunk``, 0: off): the first chunk is page-aligned."""
    remaining = prompt_len - start
    if chunk > 0 and first and ceil_div(remaining, page_size) * page_size > chunk:
        return (start + chunk // page_size * page_size) // page_size * page_size
    if chunk > 0 and not first and remaining > chunk:
        return start + chunk
    return prompt_len
