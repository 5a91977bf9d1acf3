"""SGLang 0.5.23's own ``Scheduler`` on CPU with a stub model runner: ground truth for SGLang with
requests in flight.

The real ``Scheduler`` is built (``managers/scheduler.py``: ``Scheduler.__init__`` with its real
allocators, ``UnifiedRadixCache``, ``SchedulePolicy``, ``PrefillAdder``, chunked prefill and
retraction) from a ``ServerArgs`` for the oracle's dummy one-layer model on ``device="cpu"`` with
``load_format="dummy"``. Only these are replaced:

- ``torchvision`` and ``vllm`` are import-time stubs (the oracle's ``stubs``; the rotary
  embedding's module imports ``vllm._custom_ops``, never called here);
- ``bootstrap._bind_threads_if_cpu`` returns None (NUMA binding of the CPU backend);
- the model worker's ``forward_batch_generation`` returns the next token of each request's
  recorded answer instead of running the model (the KV is never read: only which slots hold what
  matters to the cache).

Requests are handed to ``Scheduler.handle_generate_request`` (all waiting from the start, or at the
loop iteration of their ``arrive_step``); the loop is ``event_loop_normal``'s body
(``--disable-overlap-schedule``) or ``event_loop_overlap``'s, run until every request finished.
A request's hit is SGLang's own ``cached_tokens`` for it (what ``meta_info`` reports). Run with
the SGLang oracle's interpreter (``setproctitle``, ``einops``, ``uvicorn`` and ``fastapi`` added
to it)::

    .venv-oracle-sglang/bin/python tests/golden/sglang_scheduler/driver.py < reqs.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from array import array
from typing import Any

ORACLE_DIR = os.environ.get("SGLANG_ORACLE_DIR", "/work/shared/oracles/sglang")
sys.path.insert(0, os.path.join(ORACLE_DIR, "oracle_lib"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import stubs  # noqa: E402

stubs.STUB_PREFIXES = ("torchvision", "vllm")
stubs.install()

import torch  # noqa: E402

DUMMY_MODEL = os.path.join(ORACLE_DIR, "oracle_lib", "dummy_model")


def build_scheduler(options: dict[str, Any]) -> Any:
    """A real Scheduler for the dummy model; ``options`` are ServerArgs fields."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.distributed import bootstrap
    from sglang.srt.runtime_context import SpawnRanks, spawn_world_rank
    from sglang.srt.server_args import PortArgs, ServerArgs

    server_args = ServerArgs(
        model_path=DUMMY_MODEL,
        device="cpu",
        skip_tokenizer_init=True,
        load_format="dummy",
        disable_cuda_graph=True,
        attention_backend="torch_native",
        mem_fraction_static=0.5,  # the CPU "device" profile; max_total_tokens sets the pool
        **options,
    )
    ranks = SpawnRanks(
        world_rank=spawn_world_rank(server_args, tp_rank=0, pp_rank=0), dp_rank=None, gpu_id=0
    )
    rc.publish(server_args, role="scheduler", ranks=ranks)
    bootstrap._bind_threads_if_cpu = lambda device: None
    from sglang.srt.managers.scheduler import Scheduler

    logging.disable(logging.WARNING)
    return Scheduler(server_args, PortArgs.init_new(server_args))


class StubForward:
    """The model: each request's next token is the next one of its recorded answer.

    Under the overlap scheduler a forward is launched before the previous one's tokens reach
    ``req.output_ids``, so the position is counted here: one per forward that samples a token
    the scheduler keeps (not a chunk that leaves the prompt unfinished)."""

    def __init__(self, answers: dict[str, list[int]]) -> None:
        self.answers = answers
        self.sampled: dict[str, int] = {}

    def __call__(self, batch: Any, **_: Any) -> Any:
        from sglang.srt.managers.utils import GenerationBatchResult

        tokens = []
        for req in batch.reqs:
            answer = self.answers[req.rid]
            if req.inflight_middle_chunks > 0:  # a chunk that leaves the prompt unfinished:
                tokens.append(answer[0])  # its token is discarded (process_batch_result)
                continue
            n = max(self.sampled.get(req.rid, 0), len(req.output_ids))
            tokens.append(answer[min(n, len(answer) - 1)])
            self.sampled[req.rid] = n + 1
        return GenerationBatchResult(
            next_token_ids=torch.tensor(tokens, dtype=torch.int64),
            can_run_cuda_graph=False,
        )


# Added to every token id so that none is the dummy model's EOS (2): requests run as a real
# server's do, ``ignore_eos`` off (admission then estimates decode growth with
# ``new_token_ratio``), and stop only where the recorded answer does. Hits do not change.
TOKEN_SHIFT = 3


def request_input(i: int, q: dict[str, Any]) -> Any:
    """What the tokenizer manager sends for request ``i`` (its token ids shifted by
    ``TOKEN_SHIFT``): ``max_new_tokens`` is the answer's length; a stop finish stops on its last
    token (``stop_token_ids``), a length finish on ``max_new_tokens``. A row's
    ``max_new_tokens`` overrides it (a stop before the limit)."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    stop = q.get("finish_reason") == "stop"
    params = SamplingParams(
        max_new_tokens=q.get("max_new_tokens", len(q["output"])),
        stop_token_ids=[q["output"][-1] + TOKEN_SHIFT] if stop else None,
    )
    params.normalize(None)
    return TokenizedGenerateReqInput(
        rid=f"r{i}",
        input_text="",
        input_ids=array("q", [t + TOKEN_SHIFT for t in q["prompt"]]),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=params,
        return_logprob=bool(q.get("return_logprob")),
        logprob_start_len=q.get("logprob_start_len", -1) if q.get("return_logprob") else -1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=False,
        priority=q.get("priority"),
        extra_key=q.get("extra_key"),
        cache_salt=q.get("cache_salt"),
    )


def run(
    requests: list[dict[str, Any]],
    options: dict[str, Any],
    overlap: bool,
    clients: int | None = None,
    think_steps: int = 0,
) -> list[int]:
    """Each request's ``cached_tokens`` after SGLang's own event loop served them all.

    ``clients`` = K: a closed loop of K clients (a request arrives, in order, whenever fewer than K
    are unfinished, ``think_steps`` loop iterations after the finish that freed its client);
    None: every request arrives at its ``arrive_step`` (default 0)."""
    scheduler = build_scheduler({**options, "disable_overlap_schedule": not overlap})
    answers = {f"r{i}": [t + TOKEN_SHIFT for t in q["output"]] for i, q in enumerate(requests)}
    forward = StubForward(answers)
    scheduler.model_worker.forward_batch_generation = forward
    scheduler.tp_worker.forward_batch_generation = forward
    reqs: list[Any] = []
    add_to_queue = scheduler._add_request_to_queue

    def capture(req: Any, *args: Any, is_retracted: bool = False, **kwargs: Any) -> Any:
        if not is_retracted:  # a retracted request re-enters the queue: still one client's
            reqs.append(req)
        return add_to_queue(req, *args, is_retracted=is_retracted, **kwargs)

    scheduler._add_request_to_queue = capture
    pending = list(enumerate(requests))
    loop = {"step": 0}
    finished_at: dict[str, int] = {}

    def ingest() -> None:  # one call per loop iteration: arrivals, and the end
        step = loop["step"]
        for r in reqs:
            if r.finished():
                finished_at.setdefault(r.rid, step)
        thinking = sum(step - at < think_steps for at in finished_at.values())
        while pending and (
            sum(not r.finished() for r in reqs) + thinking < clients
            if clients
            else pending[0][1].get("arrive_step", 0) <= step
        ):
            i, q = pending.pop(0)
            scheduler.handle_generate_request(request_input(i, q))
        if not pending and len(reqs) == len(requests) and all(r.finished() for r in reqs):
            scheduler.gracefully_exit = True
        loop["step"] = step + 1
        if step > 200000:
            raise SystemExit("the scheduler made no progress")

    scheduler.ingest_requests = ingest
    scheduler.run_event_loop()  # event_loop_overlap, or event_loop_normal without overlap
    by_rid = {r.rid: r for r in reqs}
    return [int(by_rid[f"r{i}"].cached_tokens) for i in range(len(requests))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--max-total-tokens", type=int, default=1 << 16)
    parser.add_argument("--max-running-requests", type=int, default=8)
    parser.add_argument("--chunked-prefill-size", type=int, default=-1)
    parser.add_argument("--overlap", action="store_true")
    args = parser.parse_args()
    requests = [json.loads(line) for line in sys.stdin if line.strip()]
    options = {
        "page_size": args.page_size,
        "max_total_tokens": args.max_total_tokens,
        "max_running_requests": args.max_running_requests,
        "chunked_prefill_size": args.chunked_prefill_size,
    }
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for i, hit in enumerate(run(requests, options, args.overlap)):
        print(json.dumps({"hit": hit, "prompt_len": len(requests[i]["prompt"])}), file=out)


if __name__ == "__main__":
    main()
