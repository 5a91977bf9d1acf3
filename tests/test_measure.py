"""The torch half of the GPU mode, on CPU with the tiny preset: model, weights, CLI end to end."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import save_file  # noqa: E402

from analyzer.errors import PrefixcheckError  # noqa: E402
from analyzer.measure import run as measure_run  # noqa: E402
from analyzer.measure.model import Decoder, KVCache, _llama3_scaled, random_decoder  # noqa: E402
from analyzer.measure.presets import ModelShape, preset  # noqa: E402
from analyzer.measure.weights import load_decoder, read_shape  # noqa: E402
from cli.main import app  # noqa: E402

CPU = torch.device("cpu")
TINY = preset("tiny")
TINY_QWEN = replace(TINY, name="tiny-qwen2", architecture="qwen2", tie_word_embeddings=True)
runner = CliRunner()


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny model runs fastest, and steadiest on a busy machine, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def textbook_logits(decoder: Decoder, ids: torch.Tensor) -> torch.Tensor:
    """The same decoder written plainly: K/V heads repeated, an explicit mask, no cache."""
    s, n = decoder.shape, len(ids)
    inv_freq = 1.0 / s.rope_theta ** (torch.arange(0, s.head_dim, 2).float() / s.head_dim)
    angle = torch.outer(torch.arange(n).float(), inv_freq)[:, None, :]

    def rope(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : s.head_dim // 2], x[..., s.head_dim // 2 :]
        return torch.cat(
            (x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()), -1
        )

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + s.rms_norm_eps)

    h = decoder.model.embed_tokens.weight[ids]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    for layer in decoder.model.layers:
        a = layer.self_attn
        x = norm(h, layer.input_layernorm.weight)
        q = rope(a.q_proj(x).view(n, s.n_heads, s.head_dim))
        k = rope(a.k_proj(x).view(n, s.n_kv_heads, s.head_dim))
        v = a.v_proj(x).view(n, s.n_kv_heads, s.head_dim)
        group = s.n_heads // s.n_kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(s.head_dim)
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        h = h + a.o_proj(torch.einsum("hqk,khd->qhd", weights, v).reshape(n, -1))
        x = norm(h, layer.post_attention_layernorm.weight)
        h = h + layer.mlp.down_proj(
            torch.nn.functional.silu(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x)
        )
    return decoder.lm_head(norm(h[-1], decoder.model.norm.weight))


@pytest.mark.parametrize("shape", [TINY, TINY_QWEN], ids=lambda s: s.name)
def test_prefill_matches_the_textbook_decoder(shape: ModelShape) -> None:
    decoder = random_decoder(shape, CPU, torch.float32, seed=1)
    ids = torch.randint(0, shape.vocab_size, (37,), generator=torch.Generator().manual_seed(0))
    cache = KVCache(shape, CPU, torch.float32)
    cache.reserve(64)
    with torch.no_grad():
        expected = textbook_logits(decoder, ids)
    assert torch.allclose(decoder.prefill(ids, 0, cache), expected, atol=1e-5)
    if shape.tie_word_embeddings:
        assert decoder.lm_head.weight is decoder.model.embed_tokens.weight


@pytest.mark.parametrize("hit", [1, 7, 16, 39])
def test_prefill_on_a_cached_prefix_equals_the_full_one(hit: int) -> None:
    decoder = random_decoder(TINY, CPU, torch.float32, seed=2)
    ids = torch.randint(0, TINY.vocab_size, (40,), generator=torch.Generator().manual_seed(hit))
    cache = KVCache(TINY, CPU, torch.float32)
    cache.reserve(40)
    full = decoder.prefill(ids, 0, cache)
    decoder.prefill(ids[:hit], 0, cache)
    cached = decoder.prefill(ids[hit:], hit, cache)
    assert torch.allclose(cached, full, atol=1e-5)
    cache.k[:, :, :hit] += 1.0  # a stale prefix is visible in the logits
    assert not torch.allclose(decoder.prefill(ids[hit:], hit, cache), full, atol=1e-3)


def test_llama3_rope_scaling() -> None:
    shape = preset("llama-3.1-8b")
    base = 1.0 / shape.rope_theta ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128)
    scaled = _llama3_scaled(base, shape)
    wavelength = 2 * math.pi / base
    high, low = wavelength < 8192 / 4, wavelength > 8192 / 1
    assert torch.equal(scaled[high], base[high])
    assert torch.allclose(scaled[low], base[low] / 8)
    middle = ~(high | low)
    assert middle.any() and torch.all(
        (scaled[middle] < base[middle]) & (scaled[middle] > base[middle] / 8)
    )


def hf_folder(path: Path, shape: ModelShape, decoder: Decoder, split: bool = True) -> Path:
    """A Hugging Face folder of ``decoder``: config.json and safetensors shards."""
    path.mkdir()
    config = {
        "architectures": [
            "Qwen2ForCausalLM" if shape.architecture == "qwen2" else "LlamaForCausalLM"
        ],
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.n_heads,
        "num_hidden_layers": shape.n_layers,
        "num_key_value_heads": shape.n_kv_heads,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "vocab_size": shape.vocab_size,
    }
    (path / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous() for k, v in decoder.named_parameters()}
    names = sorted(tensors)
    half = len(names) // 2 if split else len(names)
    save_file({k: tensors[k] for k in names[:half]}, str(path / "model-00001.safetensors"))
    if split:
        save_file({k: tensors[k] for k in names[half:]}, str(path / "model-00002.safetensors"))
    return path


def test_hf_folder_loads_to_the_same_logits(tmp_path: Path) -> None:
    original = random_decoder(TINY_QWEN, CPU, torch.float32, seed=3)
    folder = hf_folder(tmp_path / "qwen", TINY_QWEN, original)
    shape = read_shape(folder, None)
    assert shape.qkv_bias and shape.tie_word_embeddings and shape.name == "qwen"
    loaded = load_decoder(folder, shape, CPU, torch.float32)
    ids = torch.arange(30) % TINY.vocab_size
    cache = KVCache(shape, CPU, torch.float32)
    cache.reserve(30)
    assert torch.equal(loaded.prefill(ids, 0, cache), original.prefill(ids, 0, cache))
    one_layer = load_decoder(folder, read_shape(folder, 1), CPU, torch.float32)
    assert len(one_layer.model.layers) == 1
    assert torch.equal(
        one_layer.model.layers[0].self_attn.q_proj.bias,
        original.model.layers[0].self_attn.q_proj.bias,
    )


def test_hf_folder_errors(tmp_path: Path) -> None:
    decoder = random_decoder(TINY, CPU, torch.float32, seed=4)
    folder = hf_folder(tmp_path / "m", TINY, decoder, split=False)
    shard = folder / "model-00001.safetensors"
    tensors = {k: v.contiguous() for k, v in decoder.named_parameters()}

    def expect(message: str) -> None:
        with pytest.raises(PrefixcheckError, match=message):
            load_decoder(folder, TINY, CPU, torch.float32)

    save_file({**tensors, "model.norm.weight": torch.ones(7)}, str(shard))
    expect(r"model.norm.weight has shape \(7,\), config.json implies \(64,\)")
    save_file({k: v for k, v in tensors.items() if k != "lm_head.weight"}, str(shard))
    expect(r"weights missing from the safetensors files: \['lm_head.weight'\]")
    save_file({**tensors, "model.layers.0.mlp.extra": torch.ones(1)}, str(shard))
    expect("unexpected tensor 'model.layers.0.mlp.extra'")
    shard.write_bytes(b"\x00" * 16)
    expect("not a readable safetensors file")
    shard.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    expect("no \\*.safetensors files")
    (folder / "config.json").write_text("{")
    with pytest.raises(PrefixcheckError, match=r"config.json:1: malformed JSON"):
        read_shape(folder, None)


def tokens_log(path: Path) -> Path:
    """Twelve requests on a 40-token system prompt: repeats, extensions, and strangers."""
    rng = np.random.default_rng(5)
    system = rng.integers(0, 5000, 40).tolist()
    prompts = [system + rng.integers(0, 5000, int(n)).tolist() for n in (5, 60, 17, 33, 90, 8)]
    prompts += [prompts[1] + [7, 8, 9], prompts[4], rng.integers(0, 5000, 70).tolist()]
    prompts += [system + rng.integers(0, 5000, 120).tolist(), prompts[3], [1, 2, 3]]
    path.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in prompts))
    return path


def measure(log: Path, *args: str | Path) -> object:
    given = [str(arg) for arg in args]
    device = [] if "--device" in given else ["--device", "cpu"]  # an option is given once
    base = ["measure", str(log), "--format", "tokens", *device, "--model-preset", "tiny"]
    return runner.invoke(app, [*base, "--repeats", "2", *given])


def test_measure_end_to_end_on_cpu(tmp_path: Path) -> None:
    log = tokens_log(tmp_path / "log.jsonl")
    per_request = tmp_path / "hits.jsonl"
    analyzed = runner.invoke(
        app,
        ["analyze", str(log), "--format", "tokens", "--per-request", str(per_request), "--quiet"],
    )
    assert analyzed.exit_code == 0, analyzed.output
    rows = [json.loads(line) for line in per_request.read_text().splitlines()]
    out = tmp_path / "m.json"
    result = measure(log, "--sample", "8", "--json", out)
    assert result.exit_code == 0, result.output
    for text in ("Measured prefill: tiny (2 layers", "Sampled requests", "Extrapolated"):
        assert text in result.output
    data = json.loads(out.read_text())
    assert data["device"].startswith("cpu") and data["dtype"] == "fp32"
    assert data["model"]["name"] == "tiny" and data["model"]["params"] == TINY.params
    assert data["sampled"] == len(data["measurements"]) == 8 and data["skipped"] == []
    assert data["logits_mismatches"] == []
    hit_classes = set()
    for m in data["measurements"]:
        row = rows[m["request"]]
        assert m["prompt_tokens"] == row["prompt_tokens"] and m["line"] == m["request"] + 1
        assert m["full_ms_min"] <= m["full_ms"] <= m["full_ms_max"]
        for engine in ("vllm", "sglang"):
            item = m["engines"][engine]
            assert item["hit_tokens"] == row[f"{engine}_hit"]
            assert item["full_ms"] == m["full_ms"] > 0 and item["cached_ms"] > 0
            assert item["logits_max_abs_diff"] <= item["logits_tolerance"] == pytest.approx(1e-4)
            if item["hit_tokens"] == 0:
                assert item["cached_ms"] == m["full_ms"] and item["logits_max_abs_diff"] == 0
        hit_classes.add(m["engines"]["sglang"]["hit_tokens"] > 0)
    assert hit_classes == {True, False}  # the sample spans hit and miss strata
    # The runner's 80-column console condenses the sample to prompt-length quartiles, each row
    # the medians of its requests (every engine's cached time shown whole, not an ellipsis).
    shown = [line.split() for line in result.output.splitlines()]
    ordered = sorted(data["measurements"], key=lambda m: m["prompt_tokens"])
    for part in np.array_split(np.arange(len(ordered)), 4):
        rows = [ordered[i] for i in part]
        if not rows:
            continue
        cached = [
            f"{np.median([m['engines'][e]['cached_ms'] for m in rows]):.2f}"
            for e in ("vllm", "sglang")
        ]
        full = f"{np.median([m['full_ms'] for m in rows]):.2f}"
        assert any(
            cells[1:2] == [str(len(rows))] and full in cells and set(cached) <= set(cells)
            for cells in shown
        ), (cached, full)
    fit = data["fit"]
    assert fit["points"] >= 8 and min(fit["intercept_ms"], fit["per_token_ms"]) >= 0
    extrapolated = data["extrapolated"]
    assert extrapolated["requests"] == 12
    full_s = extrapolated["prefill_seconds_without_cache"]
    for engine in ("vllm", "sglang"):
        item = extrapolated["engines"][engine]
        assert 0 <= item["prefill_seconds_saved"] <= full_s
        assert item["prefill_time_saved_share"] == pytest.approx(
            item["prefill_seconds_saved"] / full_s
        )
        assert item["prefill_seconds"] == pytest.approx(full_s - item["prefill_seconds_saved"])
        assert set(item["ttft_ms"]) == {"p50", "p90", "p99"}
    assert set(data["calibration"]["estimated_seconds_saved_at_effective_tflops"]) == {
        "vllm",
        "sglang",
    }


def test_analyze_measure_adds_the_measurement_to_the_report(tmp_path: Path) -> None:
    log, out = tokens_log(tmp_path / "log.jsonl"), tmp_path / "r.json"
    result = runner.invoke(
        app,
        ["analyze", str(log), "--format", "tokens", "--measure", "--model-preset", "tiny",
         "--json", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["prefill_estimate"]["model"] == "tiny"
    assert len(report["measurement"]["measurements"]) == 12  # the sample (64) exceeds the log
    assert "Prefill estimate (tiny shape" in result.output and "Extrapolated" in result.output


def test_a_wrong_prefix_fails_the_logits_check(tmp_path: Path, monkeypatch) -> None:
    def stale_prefix(self, ids, hit):  # the prefix KV of other tokens
        self.decoder.prefill((ids[:hit] + 1) % TINY.vocab_size, 0, self.cache)
        return self.timer.time(lambda: self.decoder.prefill(ids[hit:], hit, self.cache))

    monkeypatch.setattr(measure_run._Bench, "_cached", stale_prefix)
    out = tmp_path / "m.json"
    result = measure(tokens_log(tmp_path / "log.jsonl"), "--sample", "4", "--json", out)
    assert result.exit_code == 1
    assert "cached-prefix logits differ from the full prefill's" in result.output
    assert json.loads(out.read_text())["logits_mismatches"]


def test_out_of_memory_skips_the_request(tmp_path: Path, monkeypatch) -> None:
    prefill = Decoder.prefill

    def tight_memory(self, ids, start, cache):
        if len(ids) > 100:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return prefill(self, ids, start, cache)

    monkeypatch.setattr(Decoder, "prefill", tight_memory)
    out = tmp_path / "m.json"
    result = measure(tokens_log(tmp_path / "log.jsonl"), "--json", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [s["prompt_tokens"] for s in data["skipped"]] == [103, 130, 130, 160]
    assert data["skipped"][-1]["reason"] == "out of memory at 160 prompt tokens"
    assert sorted(m["prompt_tokens"] for m in data["measurements"]) == [
        3,
        45,
        48,
        57,
        70,
        73,
        73,
        100,
    ]
    assert "log.jsonl:10: out of memory at 160 prompt tokens" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtype", "fp8"], "unknown --dtype 'fp8'"),
        (["--device", "tpu"], "unknown --device 'tpu'"),
        (["--model", "nowhere"], "give --model or --model-preset, not both"),
        (["--layers", "3"], "--layers must be between 1 and 2 for tiny"),
    ],
)
def test_measure_user_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = measure(tokens_log(tmp_path / "log.jsonl"), *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_missing_model_folder_and_gpu(tmp_path: Path) -> None:
    log = tokens_log(tmp_path / "log.jsonl")
    missing = runner.invoke(app, ["measure", str(log), "--model", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "config.json: cannot read" in missing.output
    if not torch.cuda.is_available():
        no_gpu = runner.invoke(app, ["measure", str(log), "--device", "cuda"])
        assert no_gpu.exit_code == 2 and "--device cuda: torch sees no CUDA GPU" in no_gpu.output
