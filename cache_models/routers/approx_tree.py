"""The SGLang router's approximate radix tree: one tree over request text, shared by all workers
("tenants"), as sgl-model-gateway 0.3.2 (``sglang-router`` 0.3.2 on PyPI) builds it in
src/policies/tree.rs (``Tree::insert``, ``Tree::prefix_match_with_counts``,
``Tree::evict_tenant_by_size``); vllm-router 0.1.17 carries the same tree (src/policies/tree.rs).

Symbols are ints: the text's code points (what the Rust tree compares) or, for logs without text,
token ids. A node remembers the tenant that created it (``last_tenant``); a match answers that
tenant while it still holds the node, else the first tenant left on it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class _Node:
    text: np.ndarray
    parent: _Node | None
    tenants: dict[int, int] = field(default_factory=dict)  # tenant -> last access epoch
    children: dict[int, _Node] = field(default_factory=dict)  # first symbol -> child
    last_tenant: int | None = None


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two symbol arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class ApproxTree:
    """A multi-tenant radix tree over symbols: per-tenant symbol counts, LRU leaf eviction."""

    def __init__(self) -> None:
        self.root = _Node(np.empty(0, np.int64), None)
        self.size: dict[int, int] = {}  # tenant -> symbols it holds (``tenant_char_count``)
        self.epoch = 0  # ``get_epoch``: one global counter for LRU order

    def _next_epoch(self) -> int:
        self.epoch += 1
        return self.epoch - 1

    def insert(self, text: np.ndarray, tenant: int) -> None:
        self.root.tenants.setdefault(tenant, 0)
        self.size.setdefault(tenant, 0)
        remaining = text
        prev = self.root
        while len(remaining):
            first = int(remaining[0])
            child = prev.children.get(first)
            if child is None:  # a new leaf holds the rest
                leaf = _Node(remaining.copy(), prev, {tenant: self._next_epoch()}, {}, tenant)
                self.size[tenant] += len(remaining)
                prev.children[first] = leaf
                return
            shared = _shared(remaining, child.text)
            if shared < len(child.text):  # split the child at the divergence
                head = _Node(
                    child.text[:shared].copy(), prev, dict(child.tenants), {}, child.last_tenant
                )
                head.children[int(child.text[shared])] = child
                prev.children[first] = head
                child.text = child.text[shared:].copy()
                child.parent = head
                if tenant not in head.tenants:
                    self.size[tenant] += shared
                    head.tenants[tenant] = 0
                prev = head
            else:
                if tenant not in child.tenants:
                    self.size[tenant] += len(child.text)
                    child.tenants[tenant] = 0
                prev = child
            remaining = remaining[shared:]
        prev.tenants[tenant] = self._next_epoch()

    def prefix_match(self, text: np.ndarray) -> tuple[int, int | None]:
        """Symbols matched from the start and the tenant that answers (None: no tenant)."""
        remaining = text
        matched = 0
        node = self.root
        while len(remaining):
            child = node.children.get(int(remaining[0]))
            if child is None:
                break
            shared = _shared(remaining, child.text)
            matched += shared
            node = child
            if shared < len(child.text):
                break
            remaining = remaining[shared:]
        tenant = node.last_tenant
        if tenant is None or tenant not in node.tenants:
            tenant = next(iter(node.tenants), None)
            node.last_tenant = tenant
        epoch = self._next_epoch()
        if epoch & 0x7 == 0 and tenant is not None and tenant in node.tenants:
            node.tenants[tenant] = epoch  # 1 in 8 matches refresh the LRU time
        return matched, tenant

    def evict_tenant_by_size(self, max_size: int) -> None:
        """Drop each tenant's least recently used leaves until it holds at most ``max_size``."""
        heap: list[tuple[int, int, int, _Node]] = []
        order = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in self._leaf_tenants(node):
                heap.append((node.tenants[tenant], order, tenant, node))
                order += 1
        heapq.heapify(heap)
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.size.get(tenant, 0) <= max_size:
                continue
            if tenant not in node.tenants or any(
                tenant in c.tenants for c in node.children.values()
            ):
                continue
            self.size[tenant] = max(self.size[tenant] - len(node.text), 0)
            del node.tenants[tenant]
            parent = node.parent
            if not node.children and not node.tenants and parent is not None and len(node.text):
                parent.children.pop(int(node.text[0]), None)
            if (
                parent is not None
                and tenant in parent.tenants
                and not any(tenant in c.tenants for c in parent.children.values())
            ):
                heapq.heappush(heap, (parent.tenants[tenant], order, tenant, parent))
                order += 1

    @staticmethod
    def _leaf_tenants(node: _Node) -> list[int]:
        below = {t for c in node.children.values() for t in c.tenants}
        return [t for t in node.tenants if t not in below]
