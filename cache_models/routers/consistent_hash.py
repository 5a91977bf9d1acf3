"""vllm-router's ``consistent_hash`` policy: a ring of 160 virtual nodes per worker keyed by
Facebook's furc hash (mcrouter lib/fbi/hash.c), the request's session key hashed onto it.

``ConsistentHashPolicy`` in vllm-router 0.1.17 (src/policies/consistent_hash.rs:
``murmur_hash_64a``, ``murmur_rehash_64a``, ``furc_hash``, ``fbi_hash``, ``update_hash_ring``,
``find_worker_by_hash``) and the key from src/policies/hash_key.rs ``extract_hash_key``: a
``x-session-id`` header gives ``header:x-session-id:<value>``; without one the key is
``request:<text>`` (texts up to 100 bytes) or ``request_hash:<fbi_hash(text) hex>``.
"""

from __future__ import annotations

import bisect
from functools import lru_cache

import numpy as np

from cache_models.routers.base import FleetLoad, RouteRequest

M = 0xC6A4A7935BD1E995
MASK = (1 << 64) - 1
SEED = 4193360111
VIRTUAL_NODES = 160


def murmur_hash_64a(key: bytes, seed: int) -> int:
    h = (seed ^ (len(key) * M)) & MASK
    full = len(key) - len(key) % 8
    for i in range(0, full, 8):
        k = int.from_bytes(key[i : i + 8], "little")
        k = (k * M) & MASK
        k ^= k >> 47
        k = (k * M) & MASK
        h ^= k
        h = (h * M) & MASK
    rest = key[full:]
    if rest:
        for j in range(len(rest) - 1, -1, -1):
            h ^= rest[j] << (8 * j)
        h = (h * M) & MASK
    h ^= h >> 47
    h = (h * M) & MASK
    h ^= h >> 47
    return h


def murmur_rehash_64a(k: int) -> int:
    h = (SEED ^ ((8 * M) & MASK)) & MASK
    k = (k * M) & MASK
    k ^= k >> 47
    k = (k * M) & MASK
    h ^= k
    h = (h * M) & MASK
    h ^= h >> 47
    h = (h * M) & MASK
    h ^= h >> 47
    return h


def furc_hash(key: bytes, m: int) -> int:
    if m <= 1:
        return 0
    cache: list[int] = []

    def bit(idx: int) -> int:
        ord_ = idx >> 6
        while len(cache) <= ord_:
            cache.append(murmur_hash_64a(key, SEED) if not cache else murmur_rehash_64a(cache[-1]))
        return (cache[ord_] >> (idx & 0x3F)) & 1

    d = 0
    while m > (1 << d):
        d += 1
    a = d
    for _ in range(32):
        while not bit(a):
            if d == 0:
                return 0
            d -= 1
            a = d
        a += 23
        num = 1
        for _ in range(max(d - 1, 0)):
            num = (num << 1) | bit(a)
            a += 23
        if num < m:
            return num
    return 0


@lru_cache(maxsize=1 << 16)
def fbi_hash(key: str) -> int:
    furc = furc_hash(key.encode(errors="surrogatepass"), (1 << 23) - 1)
    return murmur_hash_64a(furc.to_bytes(4, "little"), SEED)


def hash_key(request: RouteRequest) -> str:
    if request.session:
        return f"header:x-session-id:{request.session}"
    text = "".join(map(chr, request.symbols.tolist()))
    if len(text.encode(errors="surrogatepass")) > 100:  # token ids may fall on surrogates
        return f"request_hash:{fbi_hash(text):016x}"
    return f"request:{text}"


class ConsistentHash:
    name = "consistent-hash"
    load_aware = False
    source = "vllm-router 0.1.17"

    def __init__(self, replicas: int, urls: list[str] | None = None) -> None:
        self.urls = urls or [f"http://replica-{i}:8000" for i in range(replicas)]
        ring = {}
        for worker, url in enumerate(self.urls):
            for v in range(VIRTUAL_NODES):
                ring[fbi_hash(f"{url}:{v}")] = worker  # BTreeMap insert: a later worker wins
        self.points = sorted(ring)
        self.owners = np.array([ring[p] for p in self.points])

    def route(self, request: RouteRequest, load: FleetLoad) -> int:
        h = fbi_hash(hash_key(request))
        i = bisect.bisect_left(self.points, h)
        return int(self.owners[i % len(self.points)])
