"""Streaming replay: chunked vs one-shot throughput, and the peak memory of a 1B-token stream
(prints, never asserts).

    .venv/bin/python tests/bench/bench_streaming_replay.py [--tokens 50e6] [--stream-tokens 1e9]

Synthetic chat traffic, generated chunk by chunk: 32 shared system prompts, multi-turn
conversations whose next prompt holds the previous prompt and answer, a salted tenant, most
tokens shared (about 95% of prompt tokens were seen before). Part 1 replays ``--tokens`` prompt
tokens through vLLM, SGLang (both with a 2M-token cache) and the prefix trie, in ~1M-token chunks
and in one replay. Part 2 generates ``--stream-tokens`` prompt tokens chunk by chunk and feeds
each chunk to the three sessions (the trie unbounded), then prints its peak RSS. Each part runs
in a process of its own (a child inherits its parent's peak RSS at fork). JIT compilation is
excluded (a warm-up first).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cache_models.config import SglangConfig, VllmConfig
from cache_models.prefix_trie import PrefixTrie
from cache_models.sglang_radix import SglangRadixCache, SglangSession
from cache_models.vllm_apc import VllmPrefixCache, VllmSession
from cache_models.workload import Workload, concat_workloads

VOCAB = 150_000
CHUNK_TOKENS = 1_000_000
CAPACITY = 2_000_000
OPEN_CHATS = 256
MAX_CONVERSATION = 24_000


class ChatTraffic:
    """An endless chat log: each chunk continues the conversations of the previous ones."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.systems = [self._text(500, 3000) for _ in range(32)]
        self.chats: list[tuple[np.ndarray, int]] = []  # (history, namespace)

    def _text(self, lo: int, hi: int) -> np.ndarray:
        return self.rng.integers(0, VOCAB, int(self.rng.integers(lo, hi)), dtype=np.int32)

    def chunk(self, min_tokens: int) -> Workload:
        """Requests until their prompts hold ``min_tokens`` tokens."""
        rng = self.rng
        prompts: list[np.ndarray] = []
        outputs: list[np.ndarray] = []
        namespaces: list[int] = []
        tokens = 0
        while tokens < min_tokens:
            if self.chats and rng.random() < 0.85:
                k = int(rng.integers(len(self.chats)))
                history, namespace = self.chats[k]
                prompt = np.concatenate([history, self._text(20, 400)])
            else:
                k = -1
                namespace = int(rng.random() < 0.1)
                system = self.systems[int(rng.integers(len(self.systems)))]
                prompt = np.concatenate([system, self._text(20, 800)])
            output = self._text(10, 500)
            history = np.concatenate([prompt, output])
            if k >= 0 and len(history) > MAX_CONVERSATION:
                self.chats[k] = self.chats[-1]
                self.chats.pop()
            elif k >= 0:
                self.chats[k] = (history, namespace)
            elif len(self.chats) < OPEN_CHATS:
                self.chats.append((history, namespace))
            prompts.append(prompt)
            outputs.append(output)
            namespaces.append(namespace)
            tokens += len(prompt)
        stop = rng.random(len(prompts)) < 0.7
        return Workload.from_arrays(prompts, outputs, namespaces, stop)


Session = VllmSession | SglangSession | PrefixTrie


def new_sessions() -> dict[str, Session]:
    """Fresh sessions of the three models."""
    return {
        "vllm (block 16, 2M-token cache)": VllmPrefixCache(
            VllmConfig(block_size=16, capacity_tokens=CAPACITY)
        ).session(),
        "sglang (page 1, lru, 2M-token cache)": SglangRadixCache(
            SglangConfig(page_size=1, capacity_tokens=CAPACITY)
        ).session(),
        "prefix trie (unbounded)": PrefixTrie(),
    }


def feed(session: Session, chunk: Workload) -> int:
    """Feed a chunk; its hit tokens (the trie's: the ideal view)."""
    if isinstance(session, PrefixTrie):
        return int(session.feed(chunk)[0].sum())
    return session.feed(chunk).total_hit_tokens


def warm_up() -> None:
    chunk = ChatTraffic(seed=99).chunk(3 * CAPACITY)  # fills the caches: every path compiled
    for session in new_sessions().values():
        feed(session, chunk)


def throughput(n_tokens: int) -> None:
    traffic = ChatTraffic()
    chunks = [traffic.chunk(CHUNK_TOKENS) for _ in range(max(1, n_tokens // CHUNK_TOKENS))]
    whole = concat_workloads(chunks)
    prompt_tokens = int(whole.prompt_lengths.sum())
    print(
        f"part 1: {whole.n_requests} requests, {prompt_tokens / 1e6:.1f}M prompt tokens "
        f"in {len(chunks)} chunks",
        flush=True,
    )
    for name in new_sessions():
        timings = {}
        for how, parts in (("chunked", chunks), ("one replay", [whole])):
            session = new_sessions()[name]
            begin = time.perf_counter()
            hits = sum(feed(session, part) for part in parts)
            timings[how] = (time.perf_counter() - begin, hits)
        (chunked_s, chunked_hits), (whole_s, whole_hits) = timings.values()
        same = "same hits" if chunked_hits == whole_hits else "HITS DIFFER"
        print(
            f"  {name:37s} chunked {prompt_tokens / chunked_s / 1e6:6.1f}M tokens/s, "
            f"one replay {prompt_tokens / whole_s / 1e6:6.1f}M tokens/s "
            f"(hit rate {whole_hits / prompt_tokens:.3f}, {same})",
            flush=True,
        )


def stream(n_tokens: int) -> None:
    """Feed chunks generated on the fly to the three sessions; report peak RSS."""
    sessions = new_sessions()
    seconds = dict.fromkeys(sessions, 0.0)
    hits = dict.fromkeys(sessions, 0)
    traffic = ChatTraffic(seed=1)
    done = requests = 0
    begin = time.perf_counter()
    report = 100_000_000
    for chunk in chunks_of(traffic, n_tokens):
        for name, session in sessions.items():
            start = time.perf_counter()
            hits[name] += feed(session, chunk)
            seconds[name] += time.perf_counter() - start
        done += int(chunk.prompt_lengths.sum())
        requests += chunk.n_requests
        if done >= report:
            report += 100_000_000
            print(
                f"  {done / 1e6:6.0f}M tokens, {requests} requests, "
                f"{time.perf_counter() - begin:5.0f} s, peak RSS {peak_rss_mb():5.0f} MB",
                flush=True,
            )
    wall = time.perf_counter() - begin
    print(f"part 2: {done / 1e6:.0f}M prompt tokens, {requests} requests, streamed in {wall:.0f} s")
    for name in sessions:
        print(
            f"  {name:37s} {done / seconds[name] / 1e6:6.1f}M tokens/s "
            f"(hit rate {hits[name] / done:.3f})"
        )
    print(f"  all three + generation: {done / wall / 1e6:.1f}M tokens/s of log")
    for name, session in sessions.items():
        if isinstance(session, PrefixTrie):
            nodes = session.nodes
            print(f"  {name}: {nodes.n_nodes} nodes, {len(nodes.store) / 1e6:.0f}M distinct tokens")
        else:
            print(f"  {name}: {session.nbytes / 1e6:.1f} MB of kernel arrays")
    print(f"  peak RSS {peak_rss_mb():.0f} MB")


def chunks_of(traffic: ChatTraffic, n_tokens: int) -> Iterator[Workload]:
    done = 0
    while done < n_tokens:
        chunk = traffic.chunk(CHUNK_TOKENS)
        done += int(chunk.prompt_lengths.sum())
        yield chunk


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=float, default=50e6)
    parser.add_argument("--stream-tokens", type=float, default=1e9)
    parser.add_argument("--part", choices=["throughput", "stream"], help="run one part here")
    args = parser.parse_args()
    if args.part is None:  # each part in a fresh process, so that one's peak RSS is its own
        for part in ("throughput", "stream"):
            options = ["--tokens", str(args.tokens), "--stream-tokens", str(args.stream_tokens)]
            subprocess.run([sys.executable, __file__, "--part", part, *options], check=True)
        return
    warm_up()
    if args.part == "throughput":
        throughput(int(args.tokens))
    else:
        stream(int(args.stream_tokens))


if __name__ == "__main__":
    main()
