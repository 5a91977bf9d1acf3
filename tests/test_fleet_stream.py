"""A sequential fleet run past --diagnose-tokens streams chunk by chunk: routers keep their state
between chunks, the replicas' and the single instance's caches keep theirs, and the whole log's
figures equal those of the same run held whole; the diagnosis covers the leading sample."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.errors import PrefixcheckError
from analyzer.fleet import FleetOptions
from analyzer.fleet_stream import stream_fleet
from analyzer.ingest import ChunkedIngest, IngestOptions
from analyzer.pipeline import AnalyzeOptions, analyze
from analyzer.progress import NoProgress
from analyzer.replay import ReplaySettings
from tests.test_fleet import conversations

TOKENS = IngestOptions(format="tokens")
WHOLE_FLEET = (  # the fleet section's figures over the whole log
    "replicas",
    "router",
    "router_source",
    "load_model",
    "hit_rate",
    "single_instance_hit_rate",
    "routing_loss_tokens",
    "per_replica",
    "request_imbalance",
    "token_imbalance",
    "keyless_requests",
    "decisions",
    "what_if",
)
PER_REQUEST = [
    "vllm_hit",
    "sglang_hit",
    "ceiling_hit",
    "replica",
    "single_vllm_hit",
    "single_sglang_hit",
    "vllm_evicted_blocks",
]


@pytest.mark.parametrize(
    "fleet",
    [
        FleetOptions(4, "round-robin"),
        FleetOptions(3, "sglang-cache-aware"),  # an approximate radix tree kept between chunks
        FleetOptions(3, "hash", session_field="user"),
        FleetOptions(2, "gaie"),  # per-pod LRUs of block hashes, a seeded tie-break
        FleetOptions(1, replica_field="pod"),  # replicas named as they first appear
    ],
    ids=lambda f: f.router if f.replica_field is None else "replica-field",
)
def test_a_streamed_fleet_equals_the_fleet_held_whole(tmp_path: Path, fleet: FleetOptions) -> None:
    log = conversations(tmp_path / "log.jsonl", sessions=10, turns=8)
    options = AnalyzeOptions(
        ingest=TOKENS,
        settings=ReplaySettings(block_size=4, page_size=2, capacity_tokens=700),
        chunk_records=7,
        sample_tokens=None,
        fleet=fleet,
        fleet_what_if=("router=hash+session-field=user", "replicas=2")
        if fleet.replica_field is None
        else (),
    )
    whole = analyze([log], options)
    streamed = analyze([log], replace(options, sample_tokens=300))
    a, b = whole.report.to_dict(), streamed.report.to_dict()
    for key in ("requests", "prompt_tokens", "engines", "ceiling", "alignment_loss"):
        assert a[key] == b[key], key
    assert {k: a["fleet"][k] for k in WHOLE_FLEET} == {k: b["fleet"][k] for k in WHOLE_FLEET}
    assert whole.per_request.select(PER_REQUEST).equals(streamed.per_request.select(PER_REQUEST))
    assert a["fleet"]["routing_loss_tokens"]["sglang"] > 0 or fleet.replicas == 1

    # The diagnosis covers the leading sample, as a streamed single-server log's does.
    assert a["diagnosis_scope"]["whole_log"] is True
    scope = b["diagnosis_scope"]
    assert scope["whole_log"] is False and 300 <= scope["prompt_tokens"] < b["prompt_tokens"]
    assert scope["requests"] % 7 == 0 and scope["requests"] < b["requests"]
    assert any("The log was streamed" in note for note in b["notes"])
    sample = streamed.per_request.head(scope["requests"])
    for engine in ("vllm", "sglang"):
        assert scope["hit_tokens"][engine] == int(sample[f"{engine}_hit"].sum())
        lost = sum(entry["tokens"] for entry in b["losses"][engine].values())
        assert lost == scope["prompt_tokens"] - scope["hit_tokens"][engine]
        routing = b["losses"][engine]["routing"]["tokens"]
        single = int(sample[f"single_{engine}_hit"].sum())
        assert routing >= single - scope["hit_tokens"][engine]  # clamped requests add, never cut
        tail = streamed.per_request[scope["requests"] :][f"{engine}_lost_routing"]
        assert tail.null_count() == len(tail)

    # The measured advice replays the sample and says so; the log's own placement has none.
    if fleet.replica_field is None:
        assert b["fleet"]["advice_sample"] == {
            "requests": scope["requests"],
            "prompt_tokens": scope["prompt_tokens"],
        }
        assert b["fleet"]["router_ranking"] and "advice_sample" not in a["fleet"]
        assert any("replayed the diagnosed sample" in note for note in b["notes"])
        assert any("measured on the diagnosed sample" in r["summary"] for r in b["recommendations"])
    else:
        assert "own placement" in b["fleet"]["advice_skipped"]


def test_a_streamed_fleet_holds_no_earlier_chunk(tmp_path: Path) -> None:
    """Memory follows the caches: once a chunk is replayed nothing keeps its tokens; only the
    diagnosed sample stays."""
    log = conversations(tmp_path / "log.jsonl")
    reader = ChunkedIngest([log], TOKENS, NoProgress())
    chunks = reader.chunks(6)
    sample = next(chunks)
    alive: list[weakref.ref] = []

    def rest() -> Iterator:
        for chunk in chunks:
            gc.collect()
            # the chunk before the last one yielded is gone (the loop still names the last)
            assert all(ref() is None for ref in alive[:-1]), "an earlier chunk is still held"
            alive.append(weakref.ref(chunk.tokenized.workload))
            yield chunk.tokenized, None
            del chunk

    run = stream_fleet(
        sample.tokenized,
        None,
        rest(),
        ReplaySettings(capacity_tokens=500),
        FleetOptions(3, "sglang-cache-aware"),
        ("router=round-robin",),
    )
    assert len(alive) == 11 and run.replayed.log.requests.height == 72
    assert "prompt_ids" not in run.replayed.log.requests.columns


def test_a_streamed_fleet_reads_unsorted_logs_in_their_order(tmp_path: Path) -> None:
    """As a streamed single-server log, a streamed fleet replays its chunks in the order read:
    an unsorted log is not sorted first (only a log held whole is)."""
    log = conversations(tmp_path / "log.jsonl")
    lines = log.read_text().splitlines()
    lines[3], lines[40] = lines[40], lines[3]  # one request out of arrival order
    log.write_text("\n".join(lines) + "\n")
    options = AnalyzeOptions(
        ingest=TOKENS, chunk_records=8, sample_tokens=200, fleet=FleetOptions(4, "round-robin")
    )
    streamed = analyze([log], options)
    assert streamed.per_request["replica"].to_list() == [i % 4 for i in range(72)]
    whole = analyze([log], replace(options, sample_tokens=None))
    assert whole.per_request["replica"].to_list() != [i % 4 for i in range(72)]
    assert any("timestamp order" in n for n in whole.report.notes)
    assert not any("timestamp order" in n for n in streamed.report.notes)
    single = analyze([log], replace(options, fleet=None))  # the same for one server
    assert not any("timestamp order" in n for n in single.report.notes)
    assert json.dumps(streamed.report.to_dict()["diagnosis_scope"]["whole_log"]) == "false"


def test_a_replica_first_named_past_the_sample_needs_replicas(tmp_path: Path) -> None:
    """--replica-field: the single instance (replicas x capacity) is sized on the sample's
    replicas before the rest streams; one named later fails the run naming its line, and
    --replicas with the log's count streams it as the log held whole is replayed."""
    log = conversations(tmp_path / "log.jsonl")
    lines = log.read_text().splitlines()
    last = json.loads(lines[-1]) | {"pod": "pod-late"}
    log.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    options = AnalyzeOptions(
        ingest=TOKENS,
        settings=ReplaySettings(capacity_tokens=500),
        chunk_records=8,
        sample_tokens=200,
        fleet=FleetOptions(1, replica_field="pod"),
    )
    with pytest.raises(PrefixcheckError, match=r"log\.jsonl:72: --replica-field 'pod' names a"):
        analyze([log], options)
    four = replace(options, fleet=FleetOptions(4, replica_field="pod"))
    streamed = analyze([log], four).report.to_dict()["fleet"]
    whole = analyze([log], replace(four, sample_tokens=None)).report.to_dict()["fleet"]
    assert streamed["replicas"] == 4 and streamed["per_replica"][3]["name"] == "pod-late"
    assert streamed["single_instance_hit_rate"] == whole["single_instance_hit_rate"]
    unbounded = replace(options, settings=ReplaySettings())  # no capacity to size: it streams
    assert analyze([log], unbounded).report.to_dict()["fleet"]["replicas"] == 4
