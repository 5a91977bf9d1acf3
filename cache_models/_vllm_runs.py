"""The sequential vLLM replay of a run-length workload (``cache_models.runs``), compiled with
numba: the token kernel's pool, map and free queue (``_vllm_kernel``), with a key per block
chained over the pieces of runs it holds instead of over its tokens.

**Keys.** A block is a sequence of pieces, each ``(run id, offset in the run, length)``; the chain
mixes the two words ``uint32(id)`` and ``offset << 32 | length`` of each piece and ends a full
block with fmix64, as the token kernel does per token. Under the runs' contract two blocks with
the same parent hold the same tokens exactly when they hold the same pieces: equal ids are equal
runs and different ids differ at their first token, so token prefixes of two requests agree
exactly as far as their entries do, and a block boundary inside a run cuts both at the same
offset. The chance of a collision is that of the token kernel's (about 2^-64 per pair).

**Replay.** vLLM's sequential replay (``vllm_apc``: ``max_in_flight == 1``, no time model), the
token kernel's ``replay_in_time`` with every arrival at 0: each runnable request in turn is looked
up, scheduled whole (prompt, then each output block once the blocks before it are full), and
freed before the next one is admitted. Lengths are in tokens, so the hits and every counter are
those of the token replay of ``expand(workload)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cache_models import _vllm_kernel as kernel
from cache_models import engine_rules as rules
from cache_models._vllm_kernel import HIT, N_BLOCKS, N_CACHED, P1, P2, SEED, SHIFT, Pool, jit


@jit
def _absorb_runs(
    h: np.uint64,
    ids: np.ndarray,
    weights: np.ndarray,
    start: int,
    stop: int,
    budget: int,
    filled: int,
    block_size: int,
    keys: np.ndarray,
    n_keys: int,
) -> tuple[np.uint64, int, int, int]:
    """Mix the first ``budget`` tokens of entries ``start:stop`` into the chain, piece by piece;
    each full block's key goes to ``keys``. Returns the state, filled, keys and budget left."""
    for j in range(start, stop):
        if budget == 0:
            break
        w = min(weights[j], budget)
        budget -= w
        run = np.uint64(np.uint32(ids[j])) * P2
        offset = 0
        while offset < w:
            piece = min(w - offset, block_size - filled)
            h ^= run
            h = ((h << np.uint64(31)) | (h >> SHIFT)) * P1
            h ^= np.uint64((np.int64(offset) << 32) | piece) * P2
            h = ((h << np.uint64(31)) | (h >> SHIFT)) * P1
            filled += piece
            offset += piece
            if filled == block_size:
                h = kernel._fmix(h)
                keys[n_keys] = np.int64(h)
                n_keys += 1
                filled = 0
    return h, filled, n_keys, budget


@jit
def run_keys(
    p_ids: np.ndarray,
    p_w: np.ndarray,
    p_off: np.ndarray,
    o_ids: np.ndarray,
    o_w: np.ndarray,
    o_off: np.ndarray,
    namespace: int,
    r: int,
    n_tokens: int,
    block_size: int,
    keys: np.ndarray,
) -> None:
    """Keys of the full blocks of request r's first ``n_tokens`` tokens (prompt, then outputs)."""
    h = kernel._fmix(SEED ^ np.uint64(np.uint32(namespace)))
    h, filled, n_keys, left = _absorb_runs(
        h, p_ids, p_w, p_off[r], p_off[r + 1], n_tokens, 0, block_size, keys, 0
    )
    _absorb_runs(h, o_ids, o_w, o_off[r], o_off[r + 1], left, filled, block_size, keys, n_keys)


@njit(cache=True, error_model="numpy", nogil=True)  # as the token replays: other replays run
def replay_sequential(
    pool: Pool,
    p_ids: np.ndarray,
    p_w: np.ndarray,
    p_off: np.ndarray,
    o_ids: np.ndarray,
    o_w: np.ndarray,
    o_off: np.ndarray,
    prompt_lengths: np.ndarray,
    output_lengths: np.ndarray,
    namespace: np.ndarray,
    runnable: np.ndarray,
    skip: np.ndarray,
    block_size: int,
    width: int,
    tally: np.ndarray,
    first: int,
    stop: int,
) -> Pool:
    """Requests ``first..stop-1``, each runnable one in turn: lookup, scheduled whole, freed (see
    the module docstring); ``prompt_lengths`` / ``output_lengths`` in tokens, ``width`` the most
    blocks one holds."""
    slots = kernel.new_slots(1, width)
    s = 0
    table, keys = slots.tables[s], slots.keys[s]
    for r in range(first, stop):
        if not runnable[r]:
            continue
        prompt_len = prompt_lengths[r]
        peak_tokens = rules.vllm_peak_tokens(prompt_len, output_lengths[r])
        peak = rules.ceil_div(peak_tokens, block_size)
        run_keys(
            p_ids, p_w, p_off, o_ids, o_w, o_off, namespace[r], r, peak_tokens, block_size, keys
        )
        kernel.touch_slots(pool, keys, peak_tokens // block_size)
        n_hit = 0
        if not skip[r]:
            n_hit = kernel.lookup(pool, keys, (prompt_len - 1) // block_size, table)
        slots.n_free[0] -= 1
        pool = kernel.reserve(pool, peak - n_hit)
        # As replay_in_time: the prompt allocated and cached, then each output block taken once
        # the blocks before it are full and cached.
        pool = kernel.allocate(pool, table, keys, n_hit, prompt_len, block_size, tally, r)
        n_cached = max(n_hit, prompt_len // block_size)
        for b in range((prompt_len + block_size - 1) // block_size, peak):
            kernel.cache_blocks(pool, table, keys, n_cached, b, tally, r)
            n_cached = max(n_cached, b)
            kernel.add_blocks(pool, table, b, b + 1, tally, r)
        kernel.cache_blocks(pool, table, keys, n_cached, peak_tokens // block_size, tally, r)
        tally[HIT, r] = n_hit * block_size
        slots.info[s, N_BLOCKS] = peak
        slots.info[s, N_CACHED] = peak_tokens // block_size
        kernel.release(pool, slots, s)
    return pool
