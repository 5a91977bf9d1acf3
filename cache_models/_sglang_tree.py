"""SGLang 0.5.23's radix tree (UnifiedRadixCache, FULL component), in plain Python.

The reference the fast kernel is checked against. It keeps SGLang's exact bookkeeping: a logical
clock (each new node takes two ticks, a split three, a match stamps the matched node and its
ancestors with one tick minus 1e-5 per level), page-granular keys, splits on match and insert,
``hit_count`` and ``priority`` updates on insert, and eviction of the unlocked leaf with the lowest
policy key. Nodes hold no slot ids: a node's KV size is the length of its key.

For ``tlru`` each node also keeps UnifiedTreeCore's two lengths
(``_set_tlru_lens_and_raise_history`` in ``mem_cache/unified_cache/unified_tree_core.py``):
``depth``, the tokens from the root through the node's end (``_tlru_cached_prefix_len``), and
``history``, the deepest depth its branch ever reached (``_tlru_history_len``, a high-water mark
that eviction never lowers). A new leaf raises ``history`` on its ancestors; a split's new parent
takes its child's ``history``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

# A match stamps the matched node with the clock and each ancestor 1e-5 less (SGLang's constant).
ANCESTOR_STAMP_STEP = 0.00001
# SLRU: nodes hit at least this often are protected (SLRUStrategy's default threshold).
SLRU_PROTECTED_HITS = 2


class Node:
    """One tree segment: a page-aligned run of tokens of one namespace."""

    __slots__ = (
        "children",
        "creation_time",
        "depth",
        "history",
        "hit_count",
        "key",
        "last_access_time",
        "lock_ref",
        "namespace",
        "parent",
        "priority",
        "size",
    )

    def __init__(self, key: np.ndarray, namespace: int, parent: Node | None, priority: int) -> None:
        self.key = key
        self.size = len(key)  # tokens, which is also its KV slots
        self.namespace = namespace
        self.parent = parent
        self.children: dict[Hashable, Node] = {}
        self.lock_ref = 0
        self.hit_count = 0
        self.priority = priority
        self.last_access_time = 0.0
        self.creation_time = 0.0
        self.depth = 0  # tokens from the root through this node (tlru bookkeeping)
        self.history = 0  # the branch's deepest depth so far (tlru bookkeeping)


@dataclass(frozen=True)
class MatchResult:
    """Cached prefix length (whole pages) and the deepest node of that prefix."""

    length: int
    node: Node


@dataclass(frozen=True)
class InsertResult:
    """``prefix_len`` tokens were already cached; ``node`` ends the inserted path."""

    prefix_len: int
    node: Node
    duplicate_tokens: int  # caller's own KV in [prev_prefix_len, prefix_len): freed
    new_tokens: int  # tokens of the new leaf


EvictionKey = Callable[[Node], tuple[float, float]]


def eviction_key(
    policy: str, slru_protected_threshold: int = SLRU_PROTECTED_HITS, tlru_tail_budget: int = 0
) -> EvictionKey:
    """Each policy's sort key (``mem_cache/evict_policy.py``); ties fall back to
    last_access_time (TreeNode.__lt__). ``tlru_tail_budget`` is TLRUStrategy's threshold minus
    next_prompt_estimate: a node is tail-safe (-1, evicted first) when the tokens above it reach
    its branch's history minus that budget."""
    keys: dict[str, EvictionKey] = {
        "lru": lambda n: (n.last_access_time, n.last_access_time),
        "lfu": lambda n: (n.hit_count, n.last_access_time),
        "fifo": lambda n: (n.creation_time, n.last_access_time),
        "mru": lambda n: (-n.last_access_time, n.last_access_time),
        "filo": lambda n: (-n.creation_time, n.last_access_time),
        "priority": lambda n: (n.priority, n.last_access_time),
        "slru": lambda n: (
            float(n.hit_count >= slru_protected_threshold),
            n.last_access_time,
        ),
        "tlru": lambda n: (
            -1.0 if n.depth - n.size >= max(n.history - tlru_tail_budget, 0) else 0.0,
            n.last_access_time,
        ),
    }
    return keys[policy]


class RadixTree:
    """Match, insert, lock and evict with SGLang's rules; sizes in tokens."""

    def __init__(
        self,
        page_size: int,
        eviction_policy: str,
        slru_protected_threshold: int = SLRU_PROTECTED_HITS,
        tlru_tail_budget: int = 0,
    ) -> None:
        self.page_size = page_size
        self.eviction_key = eviction_key(
            eviction_policy, slru_protected_threshold, tlru_tail_budget
        )
        self.clock = 0.0
        self.root = Node(np.zeros(0, np.int32), 0, None, priority=-(2**63 - 1))
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.evictable_leaves: set[Node] = set()
        self.node_splits = 0

    # -- clock -----------------------------------------------------------------------------------
    def _tick(self) -> float:
        now = self.clock
        self.clock += 1.0
        return now

    def _new_node(
        self, key: np.ndarray, namespace: int, parent: Node | None, priority: int
    ) -> Node:
        node = Node(key, namespace, parent, priority)
        node.last_access_time = self._tick()
        node.creation_time = self._tick()
        return node

    # -- keys ------------------------------------------------------------------------------------
    def page_aligned(self, tokens: np.ndarray) -> np.ndarray:
        return tokens[: len(tokens) // self.page_size * self.page_size]

    def _child_key(self, namespace: int, tokens: np.ndarray) -> Hashable:
        if self.page_size == 1:
            return (namespace, int(tokens[0]))
        return (namespace, tokens[: self.page_size].tobytes())

    def _match_len(self, node_key: np.ndarray, tokens: np.ndarray) -> int:
        """Common prefix length, rounded down to whole pages."""
        n = min(len(node_key), len(tokens))
        equal = node_key[:n] == tokens[:n]
        common = n if equal.all() else int(np.argmin(equal))
        return common // self.page_size * self.page_size

    # -- the walk shared by match and insert -----------------------------------------------------
    def _walk(self, tokens: np.ndarray, namespace: int, touch: bool) -> tuple[list[Node], int]:
        """Follow ``tokens`` down from the root, splitting the node where they diverge.

        Insert ``touch``-es every child it visits before comparing (UnifiedTreeCore._touch_node);
        match stamps the path afterwards instead.
        """
        node, matched, path = self.root, 0, []
        while matched < len(tokens):
            child = node.children.get(self._child_key(namespace, tokens[matched:]))
            if child is None:
                break
            if touch:
                child.last_access_time = self._tick()
            common = self._match_len(child.key, tokens[matched:])
            diverged = common < child.size
            if diverged:
                child = self._split(child, common)
            path.append(child)
            matched += common
            node = child
            if diverged:
                break
        return path, matched

    def _split(self, child: Node, split_len: int) -> Node:
        """Cut ``child`` after ``split_len`` tokens; the new parent inherits its stats."""
        parent = child.parent
        assert parent is not None
        new = self._new_node(child.key[:split_len], child.namespace, parent, child.priority)
        new.creation_time = child.creation_time
        new.hit_count = child.hit_count
        new.lock_ref = child.lock_ref
        new.depth = parent.depth + split_len  # the child keeps its depth
        new.history = child.history
        child.key = child.key[split_len:]
        child.size = len(child.key)
        child.parent = new
        new.children[self._child_key(child.namespace, child.key)] = child
        parent.children[self._child_key(new.namespace, new.key)] = new
        child.last_access_time = self._tick()
        self.node_splits += 1
        return new

    # -- public operations -----------------------------------------------------------------------
    def match(self, tokens: np.ndarray, namespace: int) -> MatchResult:
        """Longest cached prefix of ``tokens`` in whole pages; refreshes the path's access time."""
        tokens = self.page_aligned(tokens)
        if len(tokens) == 0:
            return MatchResult(0, self.root)
        path, matched = self._walk(tokens, namespace, touch=False)
        best = path[-1] if path else self.root
        stamp = self._tick()
        node: Node | None = best
        while node is not None:
            node.last_access_time = stamp
            stamp -= ANCESTOR_STAMP_STEP
            node = node.parent
        return MatchResult(matched, best)

    def insert(
        self,
        tokens: np.ndarray,
        namespace: int,
        prev_prefix_len: int,
        inserted_len: int,
        priority: int,
    ) -> InsertResult:
        """Add ``tokens`` (page-aligned by the caller) as a path; the uncached tail is a new leaf.

        ``prev_prefix_len``: the caller's KV below it is already the tree's (no duplicates there).
        ``inserted_len``: the caller inserted [0, here) before, so those nodes' hits were counted.
        """
        self.root.last_access_time = self._tick()
        self.root.priority = max(self.root.priority, priority)
        if len(tokens) == 0:
            return InsertResult(0, self.root, 0, 0)
        path, matched = self._walk(tokens, namespace, touch=True)
        total = duplicates = 0
        for node in path:
            node.priority = max(node.priority, priority)
            duplicates += node.size - min(node.size, max(0, prev_prefix_len - total))
            total += node.size
            if total > inserted_len:
                node.hit_count += 1
        last = path[-1] if path else self.root
        if matched == len(tokens):
            return InsertResult(matched, last, duplicates, 0)
        leaf = self._new_node(tokens[matched:].copy(), namespace, last, priority)
        leaf.depth = leaf.history = last.depth + leaf.size
        ancestor: Node | None = last
        while ancestor is not None and ancestor.history < leaf.depth:
            ancestor.history = leaf.depth
            ancestor = ancestor.parent
        last.children[self._child_key(namespace, leaf.key)] = leaf
        self.evictable_size += leaf.size
        self._refresh_leaf(leaf)
        self._refresh_leaf(last)
        if len(tokens) > inserted_len:
            leaf.hit_count += 1
        return InsertResult(matched, leaf, duplicates, leaf.size)

    def lock(self, node: Node) -> None:
        """A running request pins its path: nothing on it can be evicted."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= node.size
                self.protected_size += node.size
            node.lock_ref += 1
            self.evictable_leaves.discard(node)
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += node.size
                self.protected_size -= node.size
            node.lock_ref -= 1
            self._refresh_leaf(node)
            assert node.parent is not None
            node = node.parent

    def evict(self, enough: Callable[[], bool], on_free: Callable[[int], None]) -> None:
        """Delete unlocked leaves, lowest policy key first, until ``enough()``.

        A fresh heap over the evictable leaves; a parent left childless joins it.
        """
        heap = [(*self.eviction_key(n), id(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        while heap and not enough():
            *_, victim = heapq.heappop(heap)
            if victim not in self.evictable_leaves:
                continue
            parent = victim.parent
            assert parent is not None
            del parent.children[self._child_key(victim.namespace, victim.key)]
            self.evictable_leaves.discard(victim)
            self.evictable_size -= victim.size
            on_free(victim.size)
            self._refresh_leaf(parent)
            if parent in self.evictable_leaves:
                heapq.heappush(heap, (*self.eviction_key(parent), id(parent), parent))

    def _refresh_leaf(self, node: Node) -> None:
        if node is not self.root and node.lock_ref == 0 and not node.children:
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)
