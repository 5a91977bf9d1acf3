"""Fleet replays: routing, per-replica replays through the exact engine models, the single
instance beside them, and the ``routing`` cause that keeps per-request causes adding up."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
from typer.testing import CliRunner

from analyzer.diagnose.losses import CATEGORIES
from analyzer.fleet import FleetOptions, place
from analyzer.replay import ReplaySettings
from cache_models.config import SglangConfig, TimeModel, VllmConfig
from cache_models.routers.base import FleetLoad, RouteRequest
from cache_models.routers.dynamo import DynamoConfig, DynamoKv
from cache_models.routers.gaie import Gaie
from cache_models.routers.simple import VllmDataParallel
from cache_models.sglang_radix import SglangRadixCache
from cache_models.vllm_apc import VllmPrefixCache
from cache_models.workload import Workload
from cli.main import app

runner = CliRunner()


def conversations(path: Path, sessions: int = 12, turns: int = 6, seed: int = 0) -> Path:
    """Multi-turn sessions over a shared system prompt, interleaved, one second apart."""
    rng = random.Random(seed)
    system = list(range(1, 41))
    history = {s: system + [1000 + s] for s in range(sessions)}
    order = [s for s in range(sessions) for _ in range(turns)]
    rng.shuffle(order)
    lines = []
    for t, s in enumerate(order):
        history[s] = history[s] + [rng.randrange(2000, 9000) for _ in range(rng.randint(3, 30))]
        answer = [rng.randrange(2000, 9000) for _ in range(rng.randint(1, 12))]
        lines.append(
            {
                "prompt_token_ids": history[s],
                "output_token_ids": answer,
                "timestamp": 1_700_000_000 + t * 0.5,
                "user": f"u{s}",
                "pod": f"pod-{s % 3}",
            }
        )
        history[s] = history[s] + answer
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def analyze(tmp_path: Path, log: Path, *args: str) -> tuple[dict, pl.DataFrame]:
    report, table = tmp_path / "r.json", tmp_path / "t.parquet"
    result = runner.invoke(
        app,
        [
            "analyze",
            str(log),
            "--format",
            "tokens",
            "--quiet",
            "--json",
            str(report),
            "--per-request",
            str(table),
            *args,
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text()), pl.read_parquet(table)


def test_causes_with_routing_add_up_per_request(tmp_path: Path) -> None:
    log = conversations(tmp_path / "log.jsonl")
    report, table = analyze(
        tmp_path,
        log,
        "--replicas",
        "4",
        "--router",
        "round-robin",
        "--capacity-tokens",
        "400",
        "--concurrency",
        "2",
    )
    for engine in ("vllm", "sglang"):
        lost = sum(table[f"{engine}_lost_{c}"] for c in CATEGORIES)
        assert (lost == table["prompt_tokens"] - table[f"{engine}_hit"]).all()
        assert (table[f"{engine}_lost_routing"] >= 0).all()
        assert table[f"{engine}_lost_routing"].sum() > 0  # round-robin splits the sessions
        assert (
            report["losses"][engine]["routing"]["tokens"] == table[f"{engine}_lost_routing"].sum()
        )
    fleet = report["fleet"]
    assert fleet["replicas"] == 4 and fleet["router"] == "round-robin"
    assert [r["requests"] for r in fleet["per_replica"]] == [18, 18, 18, 18]
    assert fleet["hit_rate"]["vllm"] < fleet["single_instance_hit_rate"]["vllm"]
    assert table["replica"].to_list() == [i % 4 for i in range(72)]


def test_each_replica_replays_its_share_through_the_engine_models(tmp_path: Path) -> None:
    log = conversations(tmp_path / "log.jsonl")
    _, table = analyze(
        tmp_path,
        log,
        "--replicas",
        "3",
        "--router",
        "hash",
        "--session-field",
        "user",
        "--capacity-tokens",
        "300",
    )
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    for replica in range(3):
        mask = (table["replica"] == replica).to_numpy()
        share = [r for r, m in zip(rows, mask, strict=True) if m]
        workload = Workload.from_arrays(
            [np.array(r["prompt_token_ids"], np.int32) for r in share],
            [np.array(r["output_token_ids"], np.int32) for r in share],
        )
        vllm = VllmPrefixCache(VllmConfig(capacity_tokens=300)).replay(workload)
        sglang = SglangRadixCache(SglangConfig(capacity_tokens=300)).replay(workload)
        assert table["vllm_hit"].to_numpy()[mask].tolist() == vllm.hit_tokens.tolist()
        assert table["sglang_hit"].to_numpy()[mask].tolist() == sglang.hit_tokens.tolist()
    # A session's turns all land on one replica: consistent hashing on the user.
    users = [r["user"] for r in rows]
    placed = dict(zip(users, table["replica"].to_list(), strict=True))
    assert all(placed[u] == p for u, p in zip(users, table["replica"], strict=True))


def test_one_replica_is_the_single_instance(tmp_path: Path) -> None:
    log = conversations(tmp_path / "log.jsonl")
    alone, alone_table = analyze(tmp_path, log, "--capacity-tokens", "500")
    fleet, table = analyze(tmp_path, log, "--replicas", "1", "--capacity-tokens", "500")
    assert table["vllm_hit"].to_list() == alone_table["vllm_hit"].to_list()
    assert fleet["losses"]["vllm"]["routing"]["tokens"] == 0
    assert fleet["engines"]["sglang"]["hit_tokens"] == alone["engines"]["sglang"]["hit_tokens"]


def test_the_logs_own_placement(tmp_path: Path) -> None:
    log = conversations(tmp_path / "log.jsonl")
    report, table = analyze(tmp_path, log, "--replica-field", "pod")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    names = [r["name"] for r in report["fleet"]["per_replica"]]
    assert sorted(names) == ["pod-0", "pod-1", "pod-2"]
    assert [names[r] for r in table["replica"]] == [r["pod"] for r in rows]


def test_routing_fields_read_once_from_a_pipe(tmp_path: Path) -> None:
    """--replica-field and --session-field with dotted paths are read as the lines are parsed:
    a log on standard input (a pipe, read once) gets the same placement and keys as the file."""
    log = conversations(tmp_path / "log.jsonl")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    for row in rows:
        row["meta"] = {"pod": row.pop("pod"), "session": {"id": row.pop("user")}}
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = ["--format", "tokens", "--quiet", "--per-request"]
    runs = {}
    for name, args in {
        "placed": ["--replica-field", "meta.pod"],
        "hashed": ["--replicas", "3", "--router", "hash", "--session-field", "meta.session.id"],
    }.items():
        piped, table = tmp_path / f"{name}.json", tmp_path / f"{name}.parquet"
        with log.open("rb") as source:
            cat = subprocess.Popen(["cat"], stdin=source, stdout=subprocess.PIPE)
            result = subprocess.run(
                [sys.executable, "-m", "cli.entry", "analyze", "-", *common, str(table)]
                + ["--json", str(piped), *args],
                stdin=cat.stdout,
                capture_output=True,
                text=True,
            )
            assert cat.stdout is not None
            cat.stdout.close()
            cat.wait()
        assert result.returncode == 0, result.stderr
        from_file, file_table = analyze(tmp_path, log, *args)
        runs[name] = json.loads(piped.read_text()), pl.read_parquet(table)
        assert runs[name][0]["fleet"] == from_file["fleet"]
        assert runs[name][1]["replica"].to_list() == file_table["replica"].to_list()
    report, table = runs["placed"]
    names = [r["name"] for r in report["fleet"]["per_replica"]]
    assert [names[r] for r in table["replica"]] == [r["meta"]["pod"] for r in rows]
    report, table = runs["hashed"]
    assert report["fleet"]["keyless_requests"] == 0
    sessions = [r["meta"]["session"]["id"] for r in rows]
    replicas_of: dict[str, set[int]] = {}
    for session, replica in zip(sessions, table["replica"].to_list(), strict=True):
        replicas_of.setdefault(session, set()).add(replica)
    assert all(len(r) == 1 for r in replicas_of.values())  # a session stays on its replica
    assert len(set().union(*replicas_of.values())) == 3


def test_load_aware_routers_need_time() -> None:
    """Without timestamps every request finishes before the next: cache_aware's cold requests
    all go to replica 0 (the least loaded, first on ties). In time, requests overlap."""
    prompts = [np.arange(i * 100, i * 100 + 50, dtype=np.int32) for i in range(40)]
    workload = Workload.from_arrays(
        prompts, [np.array([7], np.int32)] * 40, arrival_s=np.arange(40) * 0.001
    )
    options = FleetOptions(4, "sglang-cache-aware")
    untimed = place(workload, [None] * 40, ReplaySettings(), options)
    assert set(untimed.replica.tolist()) == {0}
    assert "see no load" in untimed.load_model
    timed = place(
        workload,
        [None] * 40,
        ReplaySettings(max_in_flight=8, time_model=TimeModel(1000.0, 10.0)),
        options,
    )
    assert len(set(timed.replica.tolist())) == 4
    assert timed.peak_in_flight.max() > 1


def test_vllm_dp_balancer_rotates_ties() -> None:
    """vLLM 0.33's ``get_core_engine_for_request``: equal scores rotate with eng_start_index;
    a loaded engine is skipped."""
    router = VllmDataParallel(3)
    load = FleetLoad.empty(3)
    request = RouteRequest(np.array([1, 2, 3]))
    assert [router.route(request, load) for _ in range(4)] == [0, 1, 2, 0]
    load.in_flight[:] = [0, 2, 0]  # start index is now 1: engine 1 is busier, 2 wins
    assert router.route(request, load) == 2


def test_dynamo_cost_worked_cases() -> None:
    """Dynamo's ``worker_logit`` by hand (its runtime is not driven here): 4 prompt blocks,
    worker 0 holds 3 of them and 10 active blocks, worker 1 none and 2 active blocks.
    credit 1: costs 1 + 10 = 11 and 4 + 2 = 6 -> worker 1. prefill_load_scale 4: 14 vs 18 ->
    worker 0."""
    blocks = np.array([11, 12, 13, 14], np.uint64)
    load = FleetLoad(np.array([1, 1]), np.array([160, 32]))
    for scale, expected_costs, chosen in ((1.0, [11.0, 6.0], 1), (4.0, [14.0, 18.0], 0)):
        router = DynamoKv(2, DynamoConfig(prefill_load_scale=scale))
        router.blocks[0] = {11: 1e9, 12: 1e9, 13: 1e9}
        request = RouteRequest(np.empty(0), blocks=blocks, prompt_tokens=64)
        assert router.costs(request, load).tolist() == expected_costs
        assert router.route(request, load) == chosen
    # Predictions expire after router_ttl_secs: at t=200 the 120 s old blocks count for nothing.
    router = DynamoKv(2)
    first = RouteRequest(np.empty(0), blocks=blocks, prompt_tokens=64, arrival_s=0.0)
    owner = router.route(first, FleetLoad.empty(2))
    assert router.overlap(owner, blocks, 100.0) == 4
    assert router.overlap(owner, blocks, 200.0) == 0


def test_bad_router_flags_exit_2(tmp_path: Path) -> None:
    log = conversations(tmp_path / "log.jsonl")
    for args in (
        ["--router", "nope"],
        ["--router-config", "{bad"],
        ["--router", "hash", "--router-config", '{"cache_threshold": 1}'],
    ):
        result = runner.invoke(
            app, ["analyze", str(log), "--format", "tokens", "--replicas", "2", *args]
        )
        assert result.exit_code == 2, result.output
    # Without a fleet a router is not silently ignored: an unknown one is named, a known one
    # is refused as --router-config and --session-field are.
    for router, why in (("nope", "unknown"), ("hash", "need --replicas")):
        result = runner.invoke(app, ["analyze", str(log), "--format", "tokens", "--router", router])
        assert result.exit_code == 2 and why in result.output, result.output


def test_fleet_what_ifs(tmp_path: Path) -> None:
    """--what-if router=/replicas=/session-field= replays the fleet changed: one replica is the
    single instance; hashing on the user keeps sessions whole and beats round-robin here."""
    log = conversations(tmp_path / "log.jsonl")
    report, _ = analyze(
        tmp_path,
        log,
        "--replicas",
        "4",
        "--what-if",
        "replicas=1",
        "--what-if",
        "router=hash+session-field=user",
        "--what-if",
        "no-salt",
    )
    fleet = report["fleet"]
    one, hashed = fleet["what_if"]
    assert one["hit_rate"]["vllm"] == fleet["single_instance_hit_rate"]["vllm"]
    assert hashed["router"] == "consistent-hash"
    assert hashed["hit_rate"]["sglang"] > fleet["hit_rate"]["sglang"]
    assert [w["name"] for w in report["what_if"]] == ["no-salt"]


def test_measured_router_ranking_and_capacity_advice(tmp_path: Path) -> None:
    """The ranking replays each candidate router: sessions hashed whole on the user beat
    round-robin; the capacity advice is the smallest capacity tried that keeps 90% of one
    unbounded instance's SGLang hits, and it does keep them."""
    log = conversations(tmp_path / "log.jsonl")
    report, _ = analyze(tmp_path, log, "--replicas", "3", "--session-field", "user")
    fleet = report["fleet"]
    ranking = {(r["router"], r["session_field"]): r["hit_rate"] for r in fleet["router_ranking"]}
    assert ranking[("hash", "user")]["sglang"] > ranking[("round-robin", None)]["sglang"]
    rates = [r["hit_rate"]["vllm"] + r["hit_rate"]["sglang"] for r in fleet["router_ranking"]]
    assert rates == sorted(rates, reverse=True)
    advised = {r["kind"]: r for r in report["recommendations"]}
    assert "fleet_capacity" in advised
    # first-block hashing puts every session (one system prompt) on one replica: not advised.
    assert ranking[("hash", "first-block")]["sglang"] >= ranking[("hash", "user")]["sglang"]
    assert advised["router"]["summary"].startswith("Route with hash on user")
    advice = fleet["capacity_for_share"]
    if advice["capacity_tokens"] is not None:
        checked, _ = analyze(
            tmp_path,
            log,
            "--replicas",
            "3",
            "--router",
            "round-robin",
            "--capacity-tokens",
            str(advice["capacity_tokens"]),
        )
        kept = checked["engines"]["sglang"]["hit_tokens"]
        assert kept >= advice["target_hit_tokens"]
    else:
        assert advice["fleet_unbounded_hit_tokens"] < advice["target_hit_tokens"]


def test_gaie_scorers_worked_cases() -> None:
    """GAIE's default picker by hand (its Go binary is not run here): 4 blocks; pod 0 holds the
    first 2 (prefix 0.5), pod 1 none. Equal queues score 1.0 each; KV usage 0.5 vs 0:
    pod 0 = 2*1 + 2*0.5 + 3*0.5 = 4.5, pod 1 = 2*1 + 2*1 + 0 = 4.0 -> pod 0. With pod 0 three
    requests deep in its queue (queue score 0 vs 1): 2.5 vs 4.0 -> pod 1."""
    blocks = np.array([5, 6, 7, 8], np.uint64)
    router = Gaie(2)
    router.pods = {5: {0}, 6: {0}}
    load = FleetLoad(np.array([2, 0]), np.array([500, 0]), max_running=2, capacity_tokens=1000)
    request = RouteRequest(np.empty(0), blocks=blocks)
    assert router.scores(request, load).tolist() == [4.5, 4.0]
    assert router.route(request, load) == 0
    assert router.prefix_scores(blocks).tolist() == [1.0, 0.0]  # pod 0 now holds all four
    load.in_flight[:] = [5, 0]
    router.pods = {5: {0}, 6: {0}}
    assert router.scores(request, load).tolist() == [2.5, 4.0]
    assert router.route(request, load) == 1


def test_gaie_lru_forgets_the_oldest_hashes() -> None:
    """AutoTune: a pod's LRU holds its GPU blocks (capacity / 16); older hashes leave it."""
    router = Gaie(1)
    load = FleetLoad.empty(1, capacity_tokens=48)  # 3 blocks
    first = RouteRequest(np.empty(0), blocks=np.array([1, 2, 3], np.uint64))
    second = RouteRequest(np.empty(0), blocks=np.array([9, 10], np.uint64))
    router.route(first, load)
    router.route(second, load)
    assert set(router.pods) == {3, 9, 10}
    assert router.prefix_scores(first.blocks).tolist() == [0.0]


def test_first_block_keys_are_the_first_blocks_bytes() -> None:
    """The columnar first-block key is each prompt's namespace and the hex of its first block's
    int32 bytes (shorter prompts: all of it), the key the hash router has always been given."""
    from analyzer.fleet_keys import first_block_keys

    rng = np.random.default_rng(3)
    prompts = [
        rng.integers(0, 2**31 - 1 if i % 2 else 300, rng.integers(1, 40)).astype(np.int32)
        for i in range(500)
    ]
    outputs = [np.ones(1, np.int32)] * len(prompts)
    namespace = rng.integers(0, 4, len(prompts))
    workload = Workload.from_arrays(prompts, outputs, namespace=namespace)
    for block_size in (1, 5, 16):
        expected = [
            f"{ns}:{p[:block_size].tobytes().hex()}"
            for ns, p in zip(namespace, prompts, strict=True)
        ]
        assert first_block_keys(workload, block_size) == expected


def test_a_fleet_over_diagnose_tokens_is_diagnosed_whole(tmp_path: Path) -> None:
    """A fleet is not streamed: past --diagnose-tokens the diagnosis still covers every request,
    the report says so, and only the measured router ranking is skipped."""
    log = conversations(tmp_path / "log.jsonl")
    report, table = analyze(tmp_path, log, "--replicas", "3", "--diagnose-tokens", "100")
    scope, total = report["diagnosis_scope"], int(table["prompt_tokens"].sum())
    assert scope["whole_log"] and scope["prompt_tokens"] == total
    assert scope["requests"] == table.height
    assert any(
        n.startswith("The fleet was not streamed") and f"{total:,} prompt tokens" in n
        for n in report["notes"]
    )
    assert "--diagnose-tokens" in report["fleet"]["advice_skipped"]
    assert report["fleet"]["router_ranking"] == []
    assert table["vllm_lost_routing"].null_count() == 0  # per-request causes for all


def test_token_id_requests_route_on_their_ids_as_text(tmp_path: Path) -> None:
    """sgl-model-gateway routes ``/generate`` input ids on their decimal text: a log of token ids
    makes the cache-aware router's decisions of the same log given as those texts (the reader
    drops a record's ids once they are in the workload; the text comes from the workload)."""
    rng = random.Random(3)
    ids_log, text_log = tmp_path / "ids.jsonl", tmp_path / "text.jsonl"
    with ids_log.open("w") as ids_out, text_log.open("w") as text_out:
        for i in range(40):
            ids = list(range(1000 + 500 * (i % 2), 1300 + 500 * (i % 2)))
            ids += [rng.randrange(5000, 9000) for _ in range(20)]
            ids_out.write(json.dumps({"prompt_token_ids": ids}) + "\n")
            text_out.write(json.dumps({"prompt": " ".join(map(str, ids))}) + "\n")
    decisions = []
    for log, fmt in ((ids_log, "tokens"), (text_log, "prompt")):
        out = tmp_path / f"{fmt}.json"
        args = ["analyze", str(log), "--format", fmt, "--replicas", "2", "--quiet"]
        args += ["--router", "sglang-cache-aware", "--json", str(out)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        decisions.append(json.loads(out.read_text())["fleet"]["decisions"])
    assert decisions[0] == decisions[1]
    assert decisions[0]["cache_hit"] == 38  # each group's first request misses, the rest hit
