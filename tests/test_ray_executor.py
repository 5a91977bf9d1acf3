"""--executor ray on a real local Ray cluster (2 CPUs, one for the whole module): the reports are
byte-identical to --executor local apart from the executor block, and a lost worker fails the
run cleanly. Skipped when the ray extra is not installed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from analyzer.errors import PrefixcheckError
from analyzer.executors import ExecutorOptions
from analyzer.pipeline import AnalyzeOptions, analyze
from cli.main import app
from tests.test_progress import Recorder

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "chat_logs.jsonl"

ray = pytest.importorskip("ray")
pytest.importorskip("pyarrow")

from analyzer.executors.ray_executor import ACTOR_PREFIX, RayExecutor  # noqa: E402
from analyzer.executors.ray_ingest import REPLAY_STEP  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def split_lines(source: Path | list[bytes], folder: Path, parts: int, stem: str) -> list[Path]:
    """The lines of ``source`` in ``parts`` consecutive files."""
    lines = source.read_bytes().splitlines(keepends=True) if isinstance(source, Path) else source
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, piece in enumerate(np.array_split(np.arange(len(lines)), parts)):
        path = folder / f"{stem}-{i:02d}.jsonl"
        path.write_bytes(b"".join(lines[j] for j in piece))
        paths.append(path)
    return paths


def hash_trace_lines(n: int = 600, seed: int = 7) -> list[bytes]:
    """A Mooncake-style hash-id trace: conversations that grow turn by turn over shared system
    prompts, slightly out of arrival order, with two bad lines."""
    rng = np.random.default_rng(seed)
    lines, conversations, next_id = [], [], 1000
    for i in range(n):
        if not conversations or rng.random() < 0.3:
            conversations.append([int(rng.integers(0, 4))])  # one of four system prompts
        history = conversations[int(rng.integers(0, len(conversations)))]
        history.extend(range(next_id, next_id + int(rng.integers(1, 4))))
        next_id += 4
        blocks = history[:60]
        length = 512 * (len(blocks) - 1) + int(rng.integers(1, 513))
        stamp = 1000 * i + int(rng.integers(-1500, 1500))
        row = {"timestamp": stamp, "input_length": length, "output_length": 20, "hash_ids": blocks}
        lines.append((json.dumps(row) + "\n").encode())
    lines[37] = b'{"timestamp": 5, "input_length": 10, "hash_ids": []}\n'
    lines[411] = b"{not json\n"
    return lines


def run_cli(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["analyze", *map(str, args)])
    return result.exit_code, result.output


def reports(tmp_path: Path, files: list[Path], *flags: str) -> tuple[str, str, dict]:
    """The local and the Ray JSON (executor block removed) and per-request tables as text, and
    the local report."""
    texts, parsed = [], []
    for executor in ("local", "ray"):
        out = tmp_path / f"{executor}.json"
        table = tmp_path / f"{executor}.csv"
        code, output = run_cli(
            *files, "--quiet", "--no-cache", "--json", out, "--per-request", table,
            "--executor", executor, *flags,
        )  # fmt: skip
        assert code == 0, output
        report = json.loads(out.read_text())
        block = report.pop("executor", None)
        assert (block is None) == (executor == "local")
        texts.append(json.dumps(report, indent=2) + table.read_text())
        parsed.append(report)
        if block:
            assert block["ingest_shards"] == len(files)
            assert block["replay_actors"] >= 1
    return texts[0], texts[1], parsed[0]


def test_the_example_split_in_16_files_is_byte_identical(cluster, tmp_path: Path) -> None:
    files = split_lines(EXAMPLE, tmp_path / "logs", 16, "chat")
    local, on_ray, report = reports(tmp_path, files)
    assert report["requests"] == 600
    assert on_ray == local


def test_a_hash_trace_split_in_8_files_is_byte_identical(cluster, tmp_path: Path) -> None:
    files = split_lines(hash_trace_lines(), tmp_path / "trace", 8, "trace")
    local, on_ray, report = reports(tmp_path, files)
    assert report["skipped"]["count"] == 2
    assert "Requests replayed in timestamp order" in " ".join(report["notes"])
    assert on_ray == local
    # The same files as a file:// glob, read through pyarrow.fs: the same report but the names.
    out = tmp_path / "uri.json"
    code, output = run_cli(
        f"file://{tmp_path}/trace/trace-*.jsonl", "--quiet", "--no-cache", "--json", out,
        "--executor", "ray",
    )  # fmt: skip
    assert code == 0, output
    through_uri = json.loads(out.read_text())
    through_uri.pop("executor")
    assert json.dumps(through_uri).replace("file://", "") == json.dumps(report)


def tokens_log(n: int = 900, seed: int = 3) -> bytes:
    """Pre-tokenized requests of two models and two salts, unknown answers, bad lines."""
    rng = np.random.default_rng(seed)
    heads = [list(rng.integers(0, 5000, 40)) for _ in range(3)]
    lines = []
    for i in range(n):
        row: dict = {
            "prompt_token_ids": [int(t) for t in heads[i % 3]]
            + [int(t) for t in rng.integers(0, 5000, int(rng.integers(1, 30)))],
            "model": ["m-a", "m-b"][int(rng.random() < 0.4)],
            "timestamp": float(i),
        }
        if i % 5 == 0:
            row["cache_salt"] = "tenant-1"
        if i % 4 == 0:
            row["output_length"] = 3  # unknown answer tokens
        else:
            row["output_token_ids"] = [int(t) for t in rng.integers(0, 5000, 4)]
        lines.append(json.dumps(row))
        if i in (100, 700):
            lines.append('{"prompt_token_ids": []}')
    return ("\n".join(lines) + "\n").encode()


def test_byte_ranges_of_one_file_keep_lines_skips_and_pools(cluster, tmp_path: Path) -> None:
    log = tmp_path / "tokens.jsonl"
    log.write_bytes(tokens_log())
    options = AnalyzeOptions(sample_tokens=20_000, chunk_records=250)  # streamed, 4 chunks+
    local = analyze([log], options)
    executor = RayExecutor.connect(ExecutorOptions("ray", split_bytes=16_000))
    recorder = Recorder()
    on_ray = analyze([log], options, recorder, executor=executor)
    # The input bar: the cluster's ingest over the shards' bytes with its rate, then the replay.
    inputs = [e for e in recorder.events if e[0] == "input"]
    ingest = [e for e in inputs if e[1].startswith("tokenizing on Ray")]
    size = log.stat().st_size
    assert ingest[-1][1].startswith(f"tokenizing on Ray: {len(ingest) - 1}/{len(ingest) - 1} ")
    assert "M tokens/s" in ingest[-1][1] and ingest[-1][2:] == (size, size, 900)
    assert [e[1] for e in inputs[len(ingest) :]] == [REPLAY_STEP] * (len(inputs) - len(ingest))
    block = on_ray.report.to_dict().pop("executor")
    assert block["ingest_shards"] > 4 and block["replay_actors"] == 2
    want, got = local.report.to_dict(), on_ray.report.to_dict()
    # Past the sample the actors read their keyed shards: the driver fetched the sample's ids.
    sample = local.tokenized.workload
    assert block["ceiling_actor"] is True
    assert block["driver_token_ids"] == len(sample.prompt_tokens) + len(sample.output_tokens)
    assert block["driver_token_ids"] < 0.6 * (want["prompt_tokens"] + want["output_tokens"])
    got.pop("executor")
    assert want["diagnosis_scope"]["whole_log"] is False
    assert [s for s in want["skipped"]["examples"]] == got["skipped"]["examples"]
    assert json.dumps(got, indent=2) == json.dumps(want, indent=2)
    assert on_ray.per_request.equals(local.per_request)


class _KillAtReplay:
    """A progress sink that kills the first replay actor's worker process after a chunk."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.chunks = 0

    def __enter__(self) -> _KillAtReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def stage(self, name: str, total: int | None) -> None:
        pass

    def input(self, step: str, done_bytes: int, total_bytes: int | None, requests: int) -> None:
        if step != REPLAY_STEP:
            return
        self.chunks += 1
        if self.chunks == 3:  # the actors hold the first two chunks' caches
            actor = ray.get_actor(f"{ACTOR_PREFIX}0")
            os.kill(ray.get(actor.where.remote())["pid"], signal.SIGKILL)

    def advance(self, units: int) -> None:
        pass

    def compiling(self, kernel: str) -> None:
        pass

    def compiled(self) -> None:
        pass


def test_a_killed_replay_worker_fails_the_run_naming_its_pool(
    cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "tokens.jsonl"
    log.write_bytes(tokens_log(4200))  # 3 chunks (2,000 requests each), streamed
    monkeypatch.setattr("cli.main.RichProgress", _KillAtReplay)
    out = tmp_path / "report.json"
    code, output = run_cli(
        log, "--json", out, "--quiet", "--no-cache", "--diagnose-tokens", "1000",
        "--executor", "ray",
    )  # fmt: skip
    assert code == 2, output
    assert "prefixcheck: error: ray: the replay of pool model=" in output
    assert "no report written" in output
    assert not out.exists()


def test_a_bad_input_fails_as_locally(cluster, tmp_path: Path) -> None:
    good = tmp_path / "a.jsonl"
    good.write_bytes(tokens_log(50))
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"neither": 1}\n')
    for executor in ("local", "ray"):
        code, output = run_cli(good, bad, "--quiet", "--executor", executor)
        assert code == 2
        assert "b.jsonl: unknown log format" in output


def test_strict_names_the_line_a_local_run_names(cluster, tmp_path: Path) -> None:
    log = tmp_path / "tokens.jsonl"
    log.write_bytes(tokens_log())
    with pytest.raises(PrefixcheckError) as local:
        analyze([log], AnalyzeOptions(ingest=_strict()))
    executor = RayExecutor.connect(ExecutorOptions("ray", split_bytes=16_000))
    with pytest.raises(PrefixcheckError) as on_ray:
        analyze([log], AnalyzeOptions(ingest=_strict()), executor=executor)
    assert str(on_ray.value) == str(local.value)
    assert ":102:" in str(local.value)


def _strict():
    from analyzer.ingest import IngestOptions

    return IngestOptions(strict=True)


@pytest.mark.parametrize(
    "flags", [("--router", "round-robin"), ("--router", "dynamo-kv", "--replay-in-time")]
)
def test_a_fleet_replays_on_the_cluster_byte_identical(
    cluster, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    files = split_lines(EXAMPLE, tmp_path / "logs", 4, "chat")
    local, on_ray, report = reports(tmp_path, files, "--replicas", "3", *flags)
    assert report["fleet"]["replicas"] == 3
    assert [r["requests"] > 0 for r in report["fleet"]["per_replica"]] == [True] * 3
    assert sum(r["requests"] for r in report["fleet"]["per_replica"]) == 600
    assert on_ray == local
    # Replayed on the cluster: an actor per replica served, and the single instance's apart.
    served = [r for r, row in enumerate(report["fleet"]["per_replica"]) if row["requests"]]
    block = json.loads((tmp_path / "ray.json").read_text())["executor"]
    assert block["replay_actors"] == len(served) + 1
    assert block["pool_keys"] == [f"qwen2.5-7b-instruct#{r}" for r in served]


def test_a_keyed_workload_selects_and_materializes_as_the_workload_does() -> None:
    from analyzer.executors.keyed import KeyedWorkload, keyed_tables
    from cache_models.workload import Workload

    rng = np.random.default_rng(5)
    prompts = [list(rng.integers(0, 900, int(rng.integers(1, 40)))) for _ in range(60)]
    outputs = [list(rng.integers(-3, 900, int(rng.integers(1, 6)))) for _ in range(60)]
    whole = Workload.from_arrays(prompts, outputs)
    models = np.array([["a", "b", "c"][i % 3] for i in range(60)])
    keyed = keyed_tables(whole, models)
    assert keyed.keys == ["a", "b", "c"] and [t.num_rows for t in keyed.tables] == [20] * 3
    remote = KeyedWorkload(
        tables=tuple(keyed.tables),
        unknown_base=(0, 0, 0),
        source=keyed.key_of,
        row=keyed.key_row,
        prompt_offsets=whole.prompt_offsets,
        output_offsets=whole.output_offsets,
        namespace=whole.namespace,
        stop_finish=whole.stop_finish,
    )
    picked = rng.permutation(60)[:25]
    part = remote.select(picked)
    assert len(part.tables) == 3 and part.n_requests == 25
    of_b = np.flatnonzero(models == "b")
    only_b = remote.select(of_b)
    assert len(only_b.tables) == 1  # an actor fetches its own key's table only
    for got, want in ((part, whole.select(picked)), (only_b, whole.select(of_b))):
        built = got.materialize(list)
        for name in ("prompt_tokens", "prompt_offsets", "output_tokens", "output_offsets"):
            np.testing.assert_array_equal(getattr(built, name), getattr(want, name), name)


def test_a_warm_token_cache_says_how_a_cluster_counts_it(cluster, tmp_path: Path) -> None:
    from analyzer.ingest import IngestOptions

    files = split_lines(EXAMPLE, tmp_path / "logs", 2, "chat")
    options = AnalyzeOptions(ingest=IngestOptions(cache_dir=tmp_path / "cache"))
    # cold: the two shards fill the cache (one may already read what the other wrote)
    analyze(files, options, executor=RayExecutor.connect(ExecutorOptions("ray")))
    warm = analyze(files, options, executor=RayExecutor.connect(ExecutorOptions("ray")))
    notes = [note for note in warm.report.run_notes if note.startswith("Token cache")]
    assert "distinct texts read from disk" in notes[0]
    assert "summed over the 2 shards" in notes[1]
    want = analyze(files, AnalyzeOptions()).report.to_dict()
    got = warm.report.to_dict()
    got.pop("executor")
    assert json.dumps(got) == json.dumps(want)  # the notes stay off the JSON
