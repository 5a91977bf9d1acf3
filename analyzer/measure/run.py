"""Measure real prefills of sampled requests, with and without each engine's cached prefix.

For every sampled request: the full prefill of its prompt, then, per distinct hit length ``h`` the
engines' replays gave it, the prefill of ``prompt[h:]`` on top of the KV of ``prompt[:h]``, which is
computed beforehand and not timed. The KV cache and rotary tables are preallocated, so the timed
region allocates only activations.

Correctness: the last position's logits of the cached-prefix prefill must equal the full
prefill's within ``LOGITS_RTOL[dtype] · max(1, max |full logits|)``. fp32 differs only by
summation order (~1e-6 relative); fp16 and bf16 round every activation (2^-11 and 2^-8 relative),
and the prefix's K and V, computed by a GEMM over fewer rows, may round differently and carry
that through every layer: 1% and 5% of the largest logit leave room for that and still catch a
wrong position, a missing prefix or a stale cache, which change logits by their own magnitude.
"""

from __future__ import annotations

import numpy as np
import torch

from analyzer.analysis import Analysis
from analyzer.errors import PrefixcheckError
from analyzer.measure import MeasureOptions
from analyzer.measure.estimate import prefill_flops
from analyzer.measure.fit import extrapolate, fit_cost_model
from analyzer.measure.model import Decoder, KVCache, random_decoder
from analyzer.measure.presets import ModelShape, preset
from analyzer.measure.result import (
    EngineMeasurement,
    Measurement,
    RequestMeasurement,
    SkippedRequest,
)
from analyzer.measure.sampling import stratified_sample
from analyzer.measure.timing import Timer, Timing
from analyzer.measure.weights import load_decoder, read_shape
from analyzer.progress import Progress
from cache_models.runs import as_tokens
from cache_models.workload import Workload

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LOGITS_RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
WARMUP_TOKENS = 64  # the model's own warm-up prefill before any timing


class Measurer:
    """The device, dtype and shape, checked on creation; called on an analysis, it measures."""

    def __init__(self, options: MeasureOptions) -> None:
        self.options = options
        self.device = resolve_device(options.device)
        self.dtype_name = options.dtype or ("bf16" if self.device.type == "cuda" else "fp32")
        if self.dtype_name not in DTYPES:
            raise PrefixcheckError(
                f"unknown --dtype {self.dtype_name!r} (choose from {', '.join(DTYPES)})"
            )
        if options.model_path is not None and options.model_preset is not None:
            raise PrefixcheckError("give --model or --model-preset, not both")
        if options.model_path is not None:
            self.shape = read_shape(options.model_path, options.layers)
        else:
            name = options.model_preset or (
                "llama-3.1-8b" if self.device.type == "cuda" else "tiny"
            )
            self.shape = preset(name).with_layers(options.layers)

    def __call__(self, analysis: Analysis, progress: Progress) -> Measurement:
        options, shape = self.options, self.shape
        workload = as_tokens(analysis.tokenized.workload)
        hits = {
            "vllm": analysis.replays.vllm.hit_tokens,
            "sglang": analysis.replays.sglang.hit_tokens,
        }
        prompt_lengths = workload.prompt_lengths
        sample = stratified_sample(prompt_lengths, hits["sglang"], options.sample, options.seed)
        progress.stage("building the model", None)
        decoder = self._decoder()
        timer = Timer(self.device, options.repeats, options.warmup)
        bench = _Bench(decoder, timer, LOGITS_RTOL[self.dtype_name])
        bench.warm_up()
        progress.stage("measuring prefills", len(sample))
        measured, skipped = [], []
        for index in sample[np.argsort(prompt_lengths[sample], kind="stable")].tolist():
            outcome = bench.request(analysis, workload, index, hits)
            (measured if isinstance(outcome, RequestMeasurement) else skipped).append(outcome)
            progress.advance(1)
        if not measured:
            raise PrefixcheckError(f"no sampled request could be measured ({skipped[0].reason})")
        new, cached, times = _fit_points(measured)
        model = fit_cost_model(new, cached, times)
        return Measurement(
            device=_device_label(self.device),
            dtype=self.dtype_name,
            model=shape.to_dict(),
            weights=str(options.model_path)
            if options.model_path
            else f"random (seed {options.seed})",
            repeats=options.repeats,
            warmup=options.warmup,
            logits_rtol=LOGITS_RTOL[self.dtype_name],
            sampled=len(sample),
            measurements=measured,
            skipped=skipped,
            fit=model,
            extrapolated=extrapolate(model, prompt_lengths, hits),
            calibration=_calibration(shape, measured, prompt_lengths, hits),
        )

    def _decoder(self) -> Decoder:
        """The folder's weights, or seeded random ones; out of memory is a user error."""
        dtype = DTYPES[self.dtype_name]
        try:
            if self.options.model_path is not None:
                return load_decoder(self.options.model_path, self.shape, self.device, dtype)
            return random_decoder(self.shape, self.device, dtype, self.options.seed)
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not _out_of_memory(exc):
                raise
            raise PrefixcheckError(
                f"out of memory building {self.shape.name} on {self.device.type}: "
                "measure fewer layers (--layers N)"
            ) from None


def resolve_device(name: str) -> torch.device:
    """``auto``: the GPU when torch sees one, else the CPU; ``cuda`` without a GPU is an error."""
    if name not in ("auto", "cuda", "cpu"):
        raise PrefixcheckError(f"unknown --device {name!r} (choose from auto, cuda, cpu)")
    if name == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise PrefixcheckError(
            f"--device cuda: torch sees no CUDA GPU (torch {torch.__version__}, {build}); "
            "use --device cpu with --model-preset tiny"
        )
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


class _Bench:
    """Times one request's prefills on a shared, preallocated KV cache."""

    def __init__(self, decoder: Decoder, timer: Timer, logits_rtol: float) -> None:
        self.decoder, self.timer, self.logits_rtol = decoder, timer, logits_rtol
        self.device = timer.device
        self.cache = KVCache(decoder.shape, self.device, next(decoder.parameters()).dtype)

    def warm_up(self) -> None:
        """Kernel selection, allocator pools and lazy initialisation, before anything is timed."""
        ids = torch.arange(WARMUP_TOKENS, device=self.device) % self.decoder.shape.vocab_size
        self.cache.reserve(WARMUP_TOKENS)
        self.decoder.prefill(ids, 0, self.cache)
        self.decoder.prefill(ids[WARMUP_TOKENS // 2 :], WARMUP_TOKENS // 2, self.cache)

    def request(
        self, analysis: Analysis, workload: Workload, index: int, hits: dict[str, np.ndarray]
    ) -> RequestMeasurement | SkippedRequest:
        """Request ``index`` of ``workload`` (the analysis's, as tokens) measured, or skipped
        with the reason (out of memory)."""
        prompt = workload.prompt(index)
        row = analysis.tokenized.requests.row(index, named=True)
        where = (index, str(row["file"]), int(row["line"]), len(prompt))
        try:
            full, engines = self._prefills(prompt, {e: int(v[index]) for e, v in hits.items()})
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not _out_of_memory(exc):
                raise
            self.free()
            return SkippedRequest(*where, f"out of memory at {len(prompt)} prompt tokens")
        return RequestMeasurement(*where, full.median_ms, full.min_ms, full.max_ms, engines)

    def _prefills(
        self, prompt: np.ndarray, hits: dict[str, int]
    ) -> tuple[Timing, dict[str, EngineMeasurement]]:
        """The full prefill's timing and, per engine, the cached-prefix prefill at its hit."""
        ids = torch.from_numpy(np.mod(prompt, self.decoder.shape.vocab_size).astype(np.int64))
        ids = ids.to(self.device)
        self.cache.reserve(len(prompt))
        full, full_logits = self.timer.time(lambda: self.decoder.prefill(ids, 0, self.cache))
        tolerance = self.logits_rtol * max(1.0, float(full_logits.abs().max()))
        by_hit: dict[int, tuple[Timing, torch.Tensor]] = {0: (full, full_logits)}
        engines = {}
        for engine, hit in hits.items():
            if hit not in by_hit:
                by_hit[hit] = self._cached(ids, hit)
            timing, logits = by_hit[hit]
            engines[engine] = EngineMeasurement(
                hit_tokens=hit,
                full_ms=full.median_ms,
                cached_ms=timing.median_ms,
                cached_ms_min=timing.min_ms,
                cached_ms_max=timing.max_ms,
                logits_max_abs_diff=float((logits - full_logits).abs().max()),
                logits_tolerance=tolerance,
            )
        return full, engines

    def _cached(self, ids: torch.Tensor, hit: int) -> tuple[Timing, torch.Tensor]:
        """Prefill ``ids[:hit]`` (untimed: the prefix KV), then time ``ids[hit:]`` on top of it."""
        self.decoder.prefill(ids[:hit], 0, self.cache)
        suffix = ids[hit:]
        return self.timer.time(lambda: self.decoder.prefill(suffix, hit, self.cache))

    def free(self) -> None:
        """Give the cache back after an out-of-memory error, so the next request starts clean."""
        self.cache.release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _fit_points(measured: list[RequestMeasurement]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(new tokens, cached tokens, ms) of every prefill measured (one per distinct hit)."""
    points = []
    for m in measured:
        by_hit = {0: m.full_ms} | {e.hit_tokens: e.cached_ms for e in m.engines.values()}
        points += [(m.prompt_tokens - hit, hit, ms) for hit, ms in by_hit.items()]
    new, cached, times = np.array(points, np.float64).T
    return new, cached, times


def _calibration(
    shape: ModelShape,
    measured: list[RequestMeasurement],
    prompt_lengths: np.ndarray,
    hits: dict[str, np.ndarray],
) -> dict[str, object]:
    """The analytical estimate at the throughput the measured full prefills reached."""
    lengths = np.array([m.prompt_tokens for m in measured])
    flops = float(prefill_flops(shape, lengths, np.zeros_like(lengths)).sum())
    effective = flops / (sum(m.full_ms for m in measured) / 1e3)
    full = prefill_flops(shape, prompt_lengths, np.zeros_like(prompt_lengths))
    saved = {
        engine: float((full - prefill_flops(shape, prompt_lengths - h, h)).sum())
        for engine, h in hits.items()
    }
    return {
        "effective_tflops": effective / 1e12,
        "estimated_seconds_saved_at_effective_tflops": {
            engine: flops_saved / effective for engine, flops_saved in saved.items()
        },
    }


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    threads = torch.get_num_threads()
    return f"cpu ({threads} thread{'s' if threads > 1 else ''})"
