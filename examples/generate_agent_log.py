"""Write a synthetic coding-agent log: OpenAI chat-completion request/response pairs in which the
assistant mostly answers with tool calls (content null) and each turn resends the whole history.

    python examples/generate_agent_log.py > agent_log.jsonl
"""

from __future__ import annotations

import json
import random
import sys

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} in the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read_file", "run_tests", "search_code", "edit_file")
]
SYSTEM = "You are a coding agent working in a git repository. Think, then call tools. " * 8


def main(sessions: int = 40, turns: int = 6, seed: int = 7) -> None:
    rng = random.Random(seed)
    for session in range(sessions):
        messages = [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "content": f"Task {session}: fix the test in module_{session}.",
            },
        ]
        for turn in range(turns):
            last = turn == turns - 1
            call = {
                "id": f"call_{session}_{turn}",
                "type": "function",
                "function": {
                    "name": rng.choice(TOOLS)["function"]["name"],
                    "arguments": json.dumps({"path": f"src/module_{session}/file_{turn}.py"}),
                },
            }
            answer = (
                {"role": "assistant", "content": f"Done: the test of module_{session} passes."}
                if last
                else {"role": "assistant", "content": None, "tool_calls": [call]}
            )
            response = {
                "choices": [{"message": answer, "finish_reason": "stop" if last else "tool_calls"}],
                "created": 1_760_000_000 + session * 60 + turn * 5,
            }
            body = {"model": "agent", "messages": list(messages), "tools": TOOLS}
            sys.stdout.write(json.dumps({"request": body, "response": response}) + "\n")
            messages.append(answer)
            if not last:
                output = "\n".join(f"line {i}: code of file_{turn}" for i in range(40))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})


if __name__ == "__main__":
    main()
