"""The torch-free half of the GPU mode: shapes, the analytical estimate, sampling, the fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from analyzer.errors import PrefixcheckError
from analyzer.measure.estimate import (
    ASSUMED_TFLOPS,
    attention_flops_per_pair,
    linear_flops_per_token,
    prefill_estimate,
    prefill_flops,
)
from analyzer.measure.fit import extrapolate, fit_cost_model
from analyzer.measure.presets import PRESETS, ModelShape, preset
from analyzer.measure.sampling import stratified_sample
from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

LLAMA_31_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}


@pytest.mark.parametrize(
    ("name", "params", "kv_bytes"),
    [  # parameter counts as published on the models' cards / safetensors indexes
        ("llama-3.1-8b", 8_030_261_248, 2 * 32 * 8 * 128 * 2),
        ("llama-3.1-70b", 70_553_706_496, 2 * 80 * 8 * 128 * 2),
        ("qwen2.5-7b", 7_615_616_512, 2 * 28 * 4 * 128 * 2),
        ("mistral-7b", 7_248_023_552, 2 * 32 * 8 * 128 * 2),
    ],
)
def test_preset_shapes_have_the_published_sizes(name: str, params: int, kv_bytes: int) -> None:
    assert PRESETS[name].params == params
    assert PRESETS[name].kv_bytes_per_token() == kv_bytes


def test_hf_config_reads_as_the_preset() -> None:
    shape = ModelShape.from_hf_config(LLAMA_31_8B_CONFIG, "llama-3.1-8b")
    assert shape == PRESETS["llama-3.1-8b"]
    qwen = ModelShape.from_hf_config(
        {**LLAMA_31_8B_CONFIG, "architectures": ["Qwen2ForCausalLM"], "rope_scaling": None},
        "q",
    )
    assert qwen.qkv_bias and qwen.rope_scaling is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"architectures": ["GPT2LMHeadModel"]},
            "architecture ['GPT2LMHeadModel'] is not supported",
        ),
        ({"hidden_size": None}, "lacks a usable"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
    ],
)
def test_unusable_hf_configs_are_user_errors(change: dict, message: str) -> None:
    config = {k: v for k, v in {**LLAMA_31_8B_CONFIG, **change}.items() if v is not None}
    with pytest.raises(PrefixcheckError, match=message.replace("[", r"\[").replace("(", r"\(")):
        ModelShape.from_hf_config(config, "m")


def test_layer_subset() -> None:
    shape = preset("llama-3.1-70b").with_layers(4)
    assert (shape.n_layers, shape.full_layers) == (4, 80)
    with pytest.raises(PrefixcheckError, match="between 1 and 80"):
        preset("llama-3.1-70b").with_layers(81)
    with pytest.raises(PrefixcheckError, match="unknown --model-preset 'gpt-5'"):
        preset("gpt-5")


def test_prefill_flops_match_a_per_position_sum() -> None:
    shape = preset("tiny")
    linear, pair = linear_flops_per_token(shape), attention_flops_per_pair(shape)
    head = 2 * shape.hidden_size * shape.vocab_size
    for cached, new in [(0, 1), (0, 37), (16, 5), (100, 1)]:
        by_position = sum(linear + pair * (p + 1) for p in range(cached, cached + new)) + head
        assert prefill_flops(shape, np.array([new]), np.array([cached]))[0] == by_position
    # 8B: 2 FLOPs per weight of the layers, as the usual 2·N rule says
    assert linear_flops_per_token(preset("llama-3.1-8b")) == 2 * 32 * 218_112_000


def test_prefill_estimate_of_a_log() -> None:
    shape = preset("tiny")
    lengths = np.array([40, 40, 100])
    hits = {"vllm": np.array([0, 32, 96]), "sglang": np.array([0, 39, 99])}
    estimate = prefill_estimate(shape, lengths, hits, distinct_tokens=150, capacity_tokens=64)
    full = prefill_flops(shape, lengths, np.zeros(3))
    suffix = prefill_flops(shape, lengths - hits["vllm"], hits["vllm"])
    vllm = estimate.engines["vllm"]
    assert estimate.prefill_flops == full.sum()
    assert vllm.prefill_flops_saved == pytest.approx((full - suffix).sum())
    assert vllm.prefill_flops_saved_share == pytest.approx(vllm.prefill_flops_saved / full.sum())
    assert vllm.gpu_seconds_saved_at_assumed_tflops == pytest.approx(
        vllm.prefill_flops_saved / (ASSUMED_TFLOPS * 1e12)
    )
    assert vllm.hit_kv_bytes == 128 * shape.kv_bytes_per_token()
    assert 0 < vllm.prefill_flops_saved < estimate.engines["sglang"].prefill_flops_saved
    assert estimate.distinct_tokens_kv_bytes == 150 * 256
    assert estimate.capacity_kv_bytes == 64 * 256


def test_analyze_report_carries_the_estimate(tmp_path: Path) -> None:
    log = tmp_path / "t.jsonl"
    log.write_text((json.dumps({"prompt_token_ids": list(range(1, 41))}) + "\n") * 3)
    report_path = tmp_path / "r.json"
    result = runner.invoke(
        app, ["analyze", str(log), "--format", "tokens", "--json", str(report_path)]
    )
    assert result.exit_code == 0, result.output
    assert "Prefill estimate (llama-3.1-8b shape, 8.0B params)" in result.output
    report = json.loads(report_path.read_text())
    estimate = report["prefill_estimate"]
    assert estimate["model"] == "llama-3.1-8b"
    assert estimate["kv_bytes_per_token"] == 131072
    hits = report["engines"]["vllm"]["hit_tokens"]
    assert hits == 64  # two repeats of 40 tokens: 32 each
    assert estimate["engines"]["vllm"]["hit_kv_bytes"] == hits * 131072
    assert estimate["distinct_tokens_kv_bytes"] > 0 and report["measurement"] is None
    qwen = runner.invoke(
        app, ["analyze", str(log), "--format", "tokens", "--model-preset", "qwen2.5-7b", "--quiet",
              "--json", str(report_path)],
    )  # fmt: skip
    assert qwen.exit_code == 0
    assert json.loads(report_path.read_text())["prefill_estimate"]["kv_bytes_per_token"] == 57344
    bad = runner.invoke(app, ["analyze", str(log), "--model-preset", "gpt-5"])
    assert bad.exit_code == 2 and "unknown --model-preset 'gpt-5'" in bad.output


def test_stratified_sample_covers_every_stratum() -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(50, 5000, 2000)
    share = np.where(rng.random(2000) < 0.3, 0.0, rng.random(2000))
    hits = (lengths * share).astype(np.int64)
    sample = stratified_sample(lengths, hits, 24, seed=1)
    assert len(sample) == len(set(sample.tolist())) == 24
    assert np.all(np.diff(sample) > 0)
    quartiles = np.quantile(lengths, [0.25, 0.5, 0.75])
    strata = {
        (
            int(np.searchsorted(quartiles, lengths[i], side="right")),
            _hit_class(hits[i] / lengths[i]),
        )
        for i in sample
    }
    assert len(strata) == 12
    assert np.array_equal(sample, stratified_sample(lengths, hits, 24, seed=1))
    assert np.array_equal(stratified_sample(lengths[:5], hits[:5], 10, seed=1), np.arange(5))


def _hit_class(share: float) -> int:
    return 0 if share < 1e-9 else 1 if share < 0.5 else 2


def test_fit_recovers_the_cost_model_and_extrapolates() -> None:
    rng = np.random.default_rng(0)
    new, cached = rng.integers(1, 4000, 40), rng.integers(0, 4000, 40)
    times = 3.0 + 0.02 * new + 4e-6 * new * (cached + (new + 1) / 2)
    model = fit_cost_model(new, cached, times)
    assert (model.intercept_ms, model.per_token_ms, model.per_token_context_ms) == pytest.approx(
        (3.0, 0.02, 4e-6)
    )
    assert model.r_squared == pytest.approx(1.0)
    lengths = np.array([1000, 2000, 3000])
    result = extrapolate(model, lengths, {"vllm": np.array([0, 1000, 2990])})
    full = times_at(lengths, np.zeros(3))
    cached_ms = times_at(lengths - [0, 1000, 2990], np.array([0, 1000, 2990]))
    assert result.prefill_seconds_without_cache == pytest.approx(full.sum() / 1e3)
    vllm = result.engines["vllm"]
    assert vllm.prefill_seconds_saved == pytest.approx((full - cached_ms).sum() / 1e3)
    assert vllm.prefill_time_saved_share == pytest.approx(1 - cached_ms.sum() / full.sum())
    assert vllm.ttft_ms["p50"] == pytest.approx(np.median(cached_ms))


def times_at(new: np.ndarray, cached: np.ndarray) -> np.ndarray:
    return 3.0 + 0.02 * new + 4e-6 * new * (cached + (new + 1) / 2)


def test_fit_never_has_negative_coefficients() -> None:
    new = np.array([10, 20, 30, 40, 50])
    times = np.array([9.0, 8.0, 7.0, 6.0, 5.0])  # faster with more tokens: no positive slope fits
    model = fit_cost_model(new, np.zeros(5), times)
    assert model.per_token_ms == model.per_token_context_ms == 0.0
    assert model.intercept_ms == pytest.approx(7.0)


def test_measure_without_torch_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    log = tmp_path / "t.jsonl"
    log.write_text(json.dumps({"prompt_token_ids": [1, 2, 3]}) + "\n")
    result = runner.invoke(app, ["measure", str(log)])
    assert result.exit_code == 2
    assert "measure needs the gpu extra (torch is not installed)" in result.output
    assert "Traceback" not in result.output
    assert runner.invoke(app, ["analyze", str(log), "--quiet"]).exit_code == 0
    with_measure = runner.invoke(app, ["analyze", str(log), "--measure"])
    assert with_measure.exit_code == 2 and "torch is not installed" in with_measure.output


def test_the_cli_does_not_import_torch() -> None:
    code = "import sys, cli.main, analyzer.pipeline; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
