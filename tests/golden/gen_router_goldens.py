"""Write tests/golden/routers/: which worker the real routers choose for each request.

Each router package from the registry (``sglang-router``, ``vllm-router``) runs as its own process
in front of fake HTTP workers on 127.0.0.1 that answer health and model probes and record which
worker received each request. A case is a list of events: ``route`` sends request i and waits until
a worker has received it (so the router's in-flight count for that worker is up), ``finish``
releases a held request j and waits for its answer (so the count is down again). Sequential cases
finish every request before the next; loaded cases hold several open. Everything runs on
127.0.0.1 with bounded waits and stops by itself. The packages live in a separate venv, never a
dependency of prefixcheck or its tests:

    python3 -m venv /tmp/routers && /tmp/routers/bin/pip install sglang-router==0.3.2 \
        vllm-router==0.1.17 aiohttp
    /tmp/routers/bin/python tests/golden/gen_router_goldens.py --router sglang
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # the routers' gRPC probes

OUT_DIR = Path(__file__).resolve().parent / "routers"
STEP_TIMEOUT_S = 10.0  # one request's routing or answer; a case fails past it
ROUTER_START_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeWorkers:
    """N fake engines on 127.0.0.1 that record who got which request and hold answers until told."""

    def __init__(self, n: int) -> None:
        self.ports = [free_port() for _ in range(n)]
        self.received: dict[int, int] = {}  # request index -> worker
        self.arrived: dict[int, asyncio.Event] = {}
        self.release: dict[int, asyncio.Event] = {}
        self.probes: list[str] = []
        self.runners: list[web.AppRunner] = []
        self.current = -1  # the request on its way

    def expect(self, i: int) -> None:
        self.current = i
        self.arrived[i] = asyncio.Event()
        self.release[i] = asyncio.Event()

    async def start(self) -> None:
        for w, port in enumerate(self.ports):
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handler(w))
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()

    def _handler(self, worker: int):
        async def handle(request: web.Request) -> web.Response:
            path = request.path
            if request.method == "POST" and path in (
                "/generate",
                "/v1/completions",
                "/v1/chat/completions",
            ):
                body = await request.json()
                # Requests are sent one at a time, each after the previous one arrived: the one
                # arriving is the one expected (chats lose their ``user`` in the router).
                i = int(body.get("rid") or body.get("user") or self.current)
                self.received[i] = worker
                self.arrived[i].set()
                await asyncio.wait_for(self.release[i].wait(), STEP_TIMEOUT_S * 3)
                return web.json_response(_answer(path, i))
            self.probes.append(f"{worker} {request.method} {path}")
            if path in ("/v1/models", "/models"):
                return web.json_response(
                    {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
                )
            if path in ("/get_model_info", "/model_info"):
                return web.json_response({"model_path": "fake-model", "is_generation": True})
            if path in ("/get_server_info", "/server_info"):
                return web.json_response({"model_path": "fake-model", "dp_size": 1})
            if path in ("/get_load", "/v1/load", "/load"):
                return web.json_response({"load": 0})
            return web.json_response({})

        return handle


def _answer(path: str, i: int) -> dict[str, Any]:
    if path == "/generate":
        return {"text": "x", "meta_info": {"id": str(i), "finish_reason": {"type": "stop"}}}
    return {
        "id": str(i),
        "object": "text_completion",
        "choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    }


def router_command(
    router: str, policy: str, port: int, workers: list[int], extra: list[str]
) -> list[str]:
    urls = [f"http://127.0.0.1:{p}" for p in workers]
    module = {"sglang": "sglang_router.launch_router", "vllm": "vllm_router.launch_router"}[router]
    command = [
        sys.executable,
        "-m",
        module,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        "--worker-urls",
        *urls,
        "--disable-retries",
        "--disable-circuit-breaker",
    ]
    command += extra
    if router == "sglang":
        command += ["--disable-health-check", "--log-level", "warn"]
    else:
        command += ["--log-level", "warning"]
    return command


async def wait_ready(
    session: ClientSession, port: int, process: subprocess.Popen, log: Any
) -> None:
    deadline = time.monotonic() + ROUTER_START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            error = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"router exited with {process.returncode}: {error}")
        try:
            async with session.get(f"http://127.0.0.1:{port}/v1/models") as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("router did not start")


async def run_case(router: str, policy: str, case: dict[str, Any]) -> list[int]:
    """Drive one case through a fresh router process; the worker chosen for each request."""
    workers = FakeWorkers(case["workers"])
    await workers.start()
    port = free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the router, in finally)
    process = subprocess.Popen(
        router_command(router, policy, port, workers.ports, case["args"]),
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    try:
        connector = TCPConnector(limit=0)
        timeout = ClientTimeout(total=STEP_TIMEOUT_S * 4)
        async with ClientSession(connector=connector, timeout=timeout) as session:
            await wait_ready(session, port, process, log)
            await asyncio.sleep(0.5)
            order = await router_order(session, port, workers.ports)
            pending: dict[int, asyncio.Task] = {}
            for event, i in case["events"]:
                if event == "route":
                    workers.expect(i)
                    path, body = request_body(router, case, i)
                    headers = {"x-session-id": case["sessions"][i]} if case["sessions"] else {}
                    pending[i] = asyncio.create_task(
                        session.post(f"http://127.0.0.1:{port}{path}", json=body, headers=headers)
                    )
                    await asyncio.wait_for(workers.arrived[i].wait(), STEP_TIMEOUT_S)
                else:
                    workers.release[i].set()
                    response = await asyncio.wait_for(pending.pop(i), STEP_TIMEOUT_S)
                    await response.read()
                    response.release()
                    await asyncio.sleep(0.01)  # the router's in-flight count drops after the body
            for i, task in pending.items():
                workers.release[i].set()
                (await task).release()
        case["urls"] = [f"http://127.0.0.1:{workers.ports[w]}" for w in order]
        return [order.index(workers.received[i]) for i in range(len(case["texts"]))]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        await workers.stop()
        log.close()


async def router_order(session: ClientSession, port: int, ports: list[int]) -> list[int]:
    """The router's own worker list (the order its policies index), as our worker numbers."""
    async with session.get(f"http://127.0.0.1:{port}/workers") as response:
        listed = (await response.json())["workers"]
    order = [ports.index(int(w["url"].rsplit(":", 1)[1])) for w in listed]
    if sorted(order) != list(range(len(ports))):
        raise RuntimeError(f"router lists workers {order}, expected all of {len(ports)}")
    return order


def request_body(router: str, case: dict[str, Any], i: int) -> tuple[str, dict[str, Any]]:
    """The HTTP request for request i: a completion's prompt, ``/generate`` text or input ids, or
    a chat (the case's ``kind``)."""
    kind = case.get("kind", "text")
    if kind == "chat":
        body = {"model": "fake-model", "messages": case["messages"][i], "user": str(i)}
        return "/v1/chat/completions", body | {"max_tokens": 1}
    if kind == "ids":
        body = {"input_ids": case["ids"][i], "rid": str(i)}
        return "/generate", body | {"sampling_params": {"max_new_tokens": 1}}
    text = case["texts"][i]
    if router == "sglang":
        return "/generate", {"text": text, "rid": str(i), "sampling_params": {"max_new_tokens": 1}}
    body = {"model": "fake-model", "prompt": text, "user": str(i)}
    return "/v1/completions", body | {"max_tokens": 1}


WORDS = (
    "the cache prefix block token radix tree router worker replica session model prompt "
    "answer system user tool call json plan step memory 数据 缓存 前缀 é ü ñ"
).split()


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def texts_of(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    """Conversation-like prompts: sessions whose turns extend their previous prompt, a few shared
    system prompts, one-off requests; and each request's session id."""
    systems = [random_text(rng, rng.randint(5, 60)) for _ in range(3)]
    sessions: list[list[str]] = []
    texts, ids = [], []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.15 or not sessions:
            sessions.append([rng.choice(systems + [""])])
            s = len(sessions) - 1
        elif roll < 0.25:
            texts.append(random_text(rng, rng.randint(1, 30)))
            ids.append(f"one-off-{len(texts)}")
            continue
        else:
            s = rng.randrange(len(sessions))
        sessions[s].append(random_text(rng, rng.randint(1, 25)))
        texts.append(" ".join(sessions[s]).strip() or "x")
        ids.append(f"session-{s}")
    return texts, ids


def chats_of(texts: list[str], sessions: list[str], rng: random.Random) -> list[list[dict]]:
    """The same traffic as chats: a system message, then each turn as a user message with an
    answer before it; text-part lists now and then."""
    history: dict[str, list[dict[str, Any]]] = {}
    chats = []
    for text, session in zip(texts, sessions, strict=True):
        turns = history.setdefault(session, [{"role": "system", "content": text[:40]}])
        if len(turns) > 1:
            turns.append({"role": "assistant", "content": random_text(rng, rng.randint(0, 6))})
        content: Any = text[40:] or "x"
        if rng.random() < 0.2:
            content = [{"type": "text", "text": content}, {"type": "text", "text": "more"}]
        turns.append({"role": "user", "content": content})
        chats.append([dict(m) for m in turns])
    return chats


def ids_of(texts: list[str]) -> list[list[int]]:
    """The same traffic as token ids (one id per word of a fixed vocabulary)."""
    vocab = {w: k + 1 for k, w in enumerate(WORDS)}
    return [[vocab.get(w, 999) for w in t.split()] or [1] for t in texts]


def events_of(rng: random.Random, n: int, held: int) -> list[list[Any]]:
    """Route every request in order; with ``held`` > 0 keep up to that many open, finishing a
    random open one at random moments (so loads differ), else finish each before the next."""
    events: list[list[Any]] = []
    open_: list[int] = []
    for i in range(n):
        events.append(["route", i])
        open_.append(i)
        while open_ and (len(open_) > held or rng.random() < 0.4):
            events.append(["finish", open_.pop(rng.randrange(len(open_)))])
    events += [["finish", i] for i in open_]
    return events


# (policy, extra router flags, workers, requests, held open, use session headers)
PLANS: dict[str, list[tuple[str, list[str], int, int, int, bool]]] = {
    "sglang": [
        ("cache_aware", [], 2, 150, 0, False),
        ("cache_aware", [], 4, 200, 0, False),
        ("cache_aware", [], 8, 150, 6, False),
        ("cache_aware", [], 3, 200, 90, False),
        (
            "cache_aware",
            ["--balance-abs-threshold", "2", "--balance-rel-threshold", "1.2"],
            4,
            200,
            12,
            False,
        ),
        (
            "cache_aware",
            ["--cache-threshold", "0.6", "--balance-abs-threshold", "4"],
            5,
            200,
            20,
            False,
        ),
        ("round_robin", [], 3, 150, 0, False),
        ("round_robin", [], 5, 150, 10, False),
        ("cache_aware", ["kind:chat"], 4, 200, 12, False),
        ("cache_aware", ["kind:ids"], 4, 200, 12, False),
    ],
}
PLANS["vllm"] = PLANS["sglang"][:6] + [
    ("round_robin", [], 3, 150, 0, False),
    ("round_robin", [], 5, 150, 10, False),
    ("consistent_hash", [], 4, 200, 0, True),
    ("consistent_hash", [], 7, 200, 5, True),
    ("consistent_hash", [], 3, 150, 0, False),
]


def package_of(router: str) -> str:
    return {"sglang": "sglang-router", "vllm": "vllm-router"}[router]


async def generate(router: str, seed: int) -> dict[str, Any]:
    cases = []
    for k, (policy, args, workers, n, held, headers) in enumerate(PLANS[router]):
        rng = random.Random(seed * 1000 + k)
        texts, sessions = texts_of(rng, n)
        kind = next((a.split(":")[1] for a in args if a.startswith("kind:")), "text")
        args = [a for a in args if not a.startswith("kind:")]
        case = {
            "policy": policy,
            "args": args + ["--eviction-interval-secs", "3600"],
            "workers": workers,
            "texts": texts,
            "sessions": sessions if headers else [],
            "events": events_of(rng, n, held),
            "kind": kind,
        }
        if kind == "chat":
            case["messages"] = chats_of(texts, sessions, rng)
        elif kind == "ids":
            case["ids"] = ids_of(texts)
        case["chosen"] = await run_case(router, policy, case)
        print(
            f"{router} {policy} {args} workers={workers} held={held}: "
            f"{len(set(case['chosen']))} workers used",
            file=sys.stderr,
        )
        cases.append(case)
    return {"package": package_of(router), "version": version(package_of(router)), "cases": cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--router", choices=sorted(PLANS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    golden = asyncio.run(generate(args.router, args.seed))
    OUT_DIR.mkdir(exist_ok=True)
    path = OUT_DIR / f"{package_of(args.router)}.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
