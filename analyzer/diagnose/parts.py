"""Message parts in an order that breaks sharing, fixed in the requests themselves: the same tool
definitions listed in different orders, and a system prompt that does not come first.

The fixed requests are rendered and tokenized again, exactly as the originals were, so the fix is
measured like every other one. (Images are not covered: the workload keeps an image's placeholder
tokens, not its identity, so moving them cannot be measured.)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analyzer.chat import ChatRenderer
from analyzer.records import Message, Record
from analyzer.tokenizer import Tokenizer
from analyzer.workload import build_workload
from cache_models.workload import Workload

SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True)
class Reordered:
    """The log with its parts in one order, tokenized (input order), and what moved."""

    workload: Workload
    tools_reordered: int  # requests whose tool definitions now follow the common order
    system_moved: int  # requests whose system message now comes first


@dataclass(frozen=True)
class PartsSource:
    """The requests as read, and how they were rendered and tokenized."""

    records: Sequence[Record]
    tokenizer: Tokenizer
    renderer: ChatRenderer
    cache_dir: Path | None

    def reordered(self, n_requests: int) -> Reordered | None:
        """The fixed log, or None when no request changes (or tokenizing keeps a different set
        of requests than ``n_requests``)."""
        orders = _common_tool_orders(self.records)
        fixed, tools_moved, system_moved = [], 0, 0
        for record in self.records:
            tools = _reordered_tools(record.tools, orders)
            messages = _system_first(record.messages)
            tools_moved += tools is not record.tools
            system_moved += messages is not record.messages
            same = tools is record.tools and messages is record.messages
            fixed.append(record if same else replace(record, tools=tools, messages=messages))
        if not tools_moved and not system_moved:
            return None
        workload = build_workload(
            fixed, self.tokenizer, self.renderer, cache_dir=self.cache_dir
        ).workload
        if workload.n_requests != n_requests:
            return None
        return Reordered(workload, tools_moved, system_moved)


def _tool_name(tool: dict[str, Any]) -> str:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    return name if isinstance(name, str) else json.dumps(tool, sort_keys=True)


def _common_tool_orders(records: Sequence[Record]) -> dict[frozenset[str], tuple[str, ...]]:
    """For each set of tool names, the order most requests list it in."""
    seen: dict[frozenset[str], Counter[tuple[str, ...]]] = {}
    for record in records:
        if record.tools:
            names = tuple(_tool_name(tool) for tool in record.tools)
            seen.setdefault(frozenset(names), Counter())[names] += 1
    return {key: counts.most_common(1)[0][0] for key, counts in seen.items()}


def _reordered_tools(
    tools: list[dict[str, Any]] | None, orders: dict[frozenset[str], tuple[str, ...]]
) -> list[dict[str, Any]] | None:
    """The tools in their set's common order (the same list when already so)."""
    if not tools:
        return tools
    names = [_tool_name(tool) for tool in tools]
    order = orders[frozenset(names)]
    if tuple(names) == order or len(set(names)) != len(names):
        return tools
    by_name = dict(zip(names, tools, strict=True))
    return [by_name[name] for name in order]


def _system_first(messages: list[Message] | None) -> list[Message] | None:
    """System messages moved before the first turn's other messages (the same list when the
    conversation already starts with them, or has none before its first answer)."""
    if not messages or messages[0].get("role") in SYSTEM_ROLES:
        return messages
    first_answer = next(
        (i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages)
    )
    head = messages[:first_answer]
    system = [m for m in head if m.get("role") in SYSTEM_ROLES]
    if not system:
        return messages
    rest = [m for m in head if m.get("role") not in SYSTEM_ROLES]
    return system + rest + messages[first_answer:]
