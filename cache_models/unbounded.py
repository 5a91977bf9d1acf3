"""The unbounded caches of one server, replayed sequentially by one prefix trie.

Nothing is evicted, so each engine's sequential replay of a log of tokens is a view of one trie
of what every request kept: vLLM's at its block size (``_vllm_unbounded``: its hits and counters
from the trie's reach), SGLang's at page size 1 (``_sglang_unbounded``: its node splits too).
The trie is fed SGLang's stops (the requests that keep every output), so it stores exactly
SGLang's tree; vLLM keeps one token fewer of each, which its view's reach already caps.

One server's vLLM and SGLang sessions can share an ``UnboundedTrie`` (``analyzer.pool``'s
``engine_caches``): a chunk fed for one engine is replayed for every engine the trie serves, and
the others' sessions then read their results of that same chunk. So the log is walked once,
not once per engine; the sessions stay fed in step, as the pool feeds them. The trie of a
log's one server can also be its ceiling (``PrefixTrie``'s views, ``ceiling``): the ceiling's
trie keeps what SGLang's overlap scheduler keeps, so it is the same trie, node for node.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from cache_models import _sglang_unbounded, _vllm_unbounded
from cache_models.config import SglangConfig
from cache_models.prefix_trie import PrefixTrie, SplitCount, View
from cache_models.workload import Workload

Raw = tuple[np.ndarray, dict[str, np.ndarray]]  # an engine's hit tokens and counters


class UnboundedTrie:
    """vLLM's unbounded cache at ``block_size``, SGLang's (``sglang``, at page size 1) and the
    hits of the ``ceiling`` views (``PrefixTrie``'s), or some of them (None, empty: not
    served), fed chunks of one log's tokens in order."""

    def __init__(
        self,
        block_size: int | None = None,
        sglang: SglangConfig | None = None,
        ceiling: Sequence[View] = (),
    ) -> None:
        if sglang is not None and not _sglang_unbounded.by_trie(sglang):
            raise ValueError("the trie replays SGLang unbounded at page size 1 only")
        if sglang is not None and ceiling and not sglang.overlap_schedule:
            raise ValueError("a ceiling's trie keeps what SGLang's overlap scheduler keeps")
        self.block_size = block_size
        self.sglang = sglang
        views = [View("vllm", block_size)] if block_size is not None else []
        splits = None
        if sglang is not None:
            splits = SplitCount(sglang.chunked_prefill_size)
            views.append(View("sglang"))
        self.engines = tuple(v.engine for v in views) + (("ceiling",) if ceiling else ())
        if len(views) + len(ceiling) == 0:
            raise ValueError("an unbounded trie serves vLLM, SGLang, a ceiling or some of them")
        self._first_ceiling_view = len(views)
        self.trie = PrefixTrie([*views, *ceiling], splits)
        self._lock = threading.Lock()
        self._chunk: Workload | None = None  # the chunk some engines have not read yet
        self._unread: dict[str, Raw | list[np.ndarray]] = {}

    def feed(self, engine: str, chunk: Workload) -> Raw:
        """``engine``'s hit tokens and counters for ``chunk``: replayed now, for every engine
        served, unless another engine's session was just fed this same chunk."""
        raw = self._take(engine, chunk)
        assert isinstance(raw, tuple)
        return raw

    def feed_ceiling(self, chunk: Workload) -> list[np.ndarray]:
        """The hits of each ceiling view for ``chunk`` (``feed``'s terms)."""
        hits = self._take("ceiling", chunk)
        assert isinstance(hits, list)
        return hits

    def _take(self, engine: str, chunk: Workload) -> Raw | list[np.ndarray]:
        if engine not in self.engines:
            raise ValueError(f"this trie serves {', '.join(self.engines)}, not {engine}")
        with self._lock:
            if engine in self._unread and self._chunk is chunk:
                raw = self._unread.pop(engine)
                if not self._unread:
                    self._chunk = None
                return raw
            if self._unread:
                raise ValueError(
                    f"fed a new chunk before {', '.join(self._unread)} read the last one: "
                    "the sessions of one trie are fed in step"
                )
            results = self._replay(chunk)
            self._unread = {name: raw for name, raw in results.items() if name != engine}
            self._chunk = chunk if self._unread else None
            return results[engine]

    def _replay(self, chunk: Workload) -> dict[str, Raw | list[np.ndarray]]:
        stops = chunk.sglang_stop_finish
        if self.sglang is not None:
            stops = stops & self.sglang.overlap_schedule  # those that keep every output
        fed = self.trie.feed_tokens(chunk, stops)
        first = self._first_ceiling_view
        reach = dict(zip(self.engines[:first], fed.reach[:first], strict=True))
        results: dict[str, Raw | list[np.ndarray]] = {}
        if "ceiling" in self.engines:
            results["ceiling"] = fed.hits[first:]
        if self.block_size is not None:
            results["vllm"] = _vllm_unbounded.of_reach(chunk, reach["vllm"], self.block_size)
        if self.sglang is not None:
            assert fed.splits is not None
            raw = _sglang_unbounded.of_reach(chunk, reach["sglang"], fed.splits, stops)
            results["sglang"] = raw
        return results
