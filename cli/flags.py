"""Every flag, declared once, in groups that commands share; each group parses and checks its
flags where they enter, before anything is read.

A command takes a group as one parameter (``cache: CacheFlags``); ``@flag_groups`` spreads the
group's fields into typer options and builds the group from them when the command is called, so a
bad value fails at once (exit 2) and a command's signature stays short. Field names are the
options' names (``block_size`` is ``--block-size``, the key ``block-size`` in prefixcheck.toml).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from rich.console import Console

from analyzer.diagnose.what_if import WhatIfSpec
from analyzer.errors import PrefixcheckError
from analyzer.executors import ExecutorName, ExecutorOptions
from analyzer.fleet_run import is_fleet_fix
from analyzer.gates import LossLimit, parse_rate
from analyzer.ingest import IngestOptions
from analyzer.measure.estimate import KV_DTYPE_BYTES
from analyzer.measure.presets import DEFAULT_ESTIMATE_PRESET, PRESETS, preset
from analyzer.pipeline import DEFAULT_SAMPLE_TOKENS
from analyzer.replay import ReplaySettings
from cache_models.config import SGLANG_SERVER_EVICTION_POLICIES, SglangEvictionPolicy, TimeModel
from cache_models.defaults import (
    DEFAULT_GPU,
    VllmEntryPoint,
    parse_gpu,
    sglang_chunked_prefill_size,
    vllm_max_num_batched_tokens,
)
from cli.common import STDOUT, fail, to_stdout
from cli.fleet_flags import FleetFlags
from cli.inputs import (
    Cache,
    ChatTemplate,
    ChatTemplateKwargs,
    FastTokenizer,
    Format,
    HashBlockSize,
    MessagesField,
    PromptField,
    RenderAs,
    SaltField,
    TenantField,
    TimeField,
    TokenizerSpec,
    ingest_options,
)

F = TypeVar("F", bound=Callable[..., Any])

# Requests in flight in an arrival-time replay unless --concurrency says otherwise (vLLM's
# default max_num_seqs).
DEFAULT_TIMED_CONCURRENCY = 256

GateEngine = Literal["vllm", "sglang", "both"]


def writable(path: Path | None, flag: str) -> None:
    """Whether ``path`` can be written (checked before the run, not after it); ``-`` is standard
    output."""
    if path is None or path == STDOUT:
        return
    if path.is_dir():
        raise PrefixcheckError(f"{flag} {path}: is a folder")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise PrefixcheckError(f"{flag} {path}: no folder {parent}")
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        raise PrefixcheckError(f"{flag} {path}: cannot write (permission denied)")


@dataclass(frozen=True)
class ReadFlags:
    """How logs are read and tokenized (analyze, measure, export-trace)."""

    log_format: Format = "auto"
    tokenizer: TokenizerSpec = None
    hash_block_size: HashBlockSize = None
    prompt_field: PromptField = None
    messages_field: MessagesField = None
    time_field: TimeField = None
    tenant_field: TenantField = None
    salt_field: SaltField = None
    chat_template: ChatTemplate = None
    chat_template_kwargs: ChatTemplateKwargs = None
    render_as: RenderAs = "vllm"
    cache: Cache = True
    fast_tokenizer: FastTokenizer = True
    strict: Annotated[bool, typer.Option(help="Stop at the first bad line (exit 2).")] = False
    ingest: IngestOptions = field(init=False, repr=False)

    def __post_init__(self) -> None:
        options = ingest_options(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        )
        object.__setattr__(self, "ingest", options)


@dataclass(frozen=True)
class CacheFlags:
    """The engines' cache flags (analyze, measure)."""

    block_size: Annotated[int, typer.Option(min=1, help="vLLM --block-size.")] = 16
    page_size: Annotated[int, typer.Option(min=1, help="SGLang --page-size.")] = 1
    capacity_tokens: Annotated[
        int | None,
        typer.Option(
            "--capacity-tokens",
            "--max-total-tokens",
            min=1,
            help="Usable KV capacity in tokens, SGLang's --max-total-tokens (default: unbounded).",
        ),
    ] = None
    kv_cache_memory: Annotated[
        str | None,
        typer.Option(
            "--kv-cache-memory-bytes",
            "--kv-cache-memory",
            metavar="BYTES",
            help="Usable KV capacity in bytes, as vLLM's --kv-cache-memory-bytes (80GiB, 8e10), "
            "in tokens of the --model-preset shape; instead of --capacity-tokens.",
        ),
    ] = None
    eviction_policy: Annotated[
        SglangEvictionPolicy,
        typer.Option(
            "--eviction-policy",
            "--radix-eviction-policy",
            metavar="POLICY",
            help=f"SGLang --radix-eviction-policy: {', '.join(SGLANG_SERVER_EVICTION_POLICIES)} "
            "(tlru needs --radix-eviction-policy-config); fifo, mru and filo are what-ifs only, "
            "not options SGLang's server accepts.",
        ),
    ] = "lru"
    radix_eviction_policy_config: Annotated[
        str | None,
        typer.Option(
            help='SGLang --radix-eviction-policy-config, JSON: slru {"protected_threshold": P} '
            '(default 2); tlru {"threshold": T, "next_prompt_estimate": Q} (tokens, T > Q).'
        ),
    ] = None
    policy_params: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "policy_params",
            eviction_policy_params(self.eviction_policy, self.radix_eviction_policy_config),
        )

    def capacity(self, model_preset: str | None = None) -> int | None:
        """The capacity in tokens: --capacity-tokens, or --kv-cache-memory-bytes over the KV
        bytes per token of the model shape (bf16 KV)."""
        if self.kv_cache_memory is None:
            return self.capacity_tokens
        if self.capacity_tokens is not None:
            raise PrefixcheckError(
                "--capacity-tokens and --kv-cache-memory-bytes both set the KV capacity: give one"
            )
        shape = preset(model_preset or DEFAULT_ESTIMATE_PRESET)
        per_token = shape.kv_bytes_per_token(KV_DTYPE_BYTES)
        tokens = parse_bytes(self.kv_cache_memory, "--kv-cache-memory-bytes") // per_token
        if tokens < 1:
            raise PrefixcheckError(
                f"--kv-cache-memory-bytes {self.kv_cache_memory}: less than one token of KV on "
                f"{shape.name} ({per_token:,} bytes per token)"
            )
        return tokens

    def settings(
        self, scheduler: SchedulerFlags | None = None, model_preset: str | None = None
    ) -> ReplaySettings:
        """The replay settings of these flags (and the scheduler's), checked as the engines
        check theirs (a block or page fits the capacity)."""
        settings = ReplaySettings(
            block_size=self.block_size,
            page_size=self.page_size,
            capacity_tokens=self.capacity(model_preset),
            eviction_policy=self.eviction_policy,
            **self.policy_params,
            **(scheduler.settings() if scheduler else {}),
        )
        try:
            settings.vllm(), settings.sglang()
        except ValueError as exc:
            raise PrefixcheckError(f"engine flags: {exc}") from None
        return settings


# What --radix-eviction-policy-config passes to each policy (SGLang's keyword arguments) and the
# ReplaySettings field each one sets.
POLICY_CONFIG_KEYS = {
    "slru": {"protected_threshold": "slru_protected_threshold"},
    "tlru": {"threshold": "tlru_threshold", "next_prompt_estimate": "tlru_next_prompt_estimate"},
}


def eviction_policy_params(policy: str, config: str | None) -> dict[str, int]:
    """The ReplaySettings fields of ``--radix-eviction-policy-config`` for ``policy``, checked as
    SGLang checks them at start-up (an unknown key, a non-integer, tlru without T > Q >= 0)."""
    if config is None:
        if policy == "tlru":
            raise PrefixcheckError(
                "--eviction-policy tlru needs --radix-eviction-policy-config "
                '\'{"threshold": T, "next_prompt_estimate": Q}\' (SGLang refuses it without)'
            )
        return {}
    try:
        values = json.loads(config)
    except json.JSONDecodeError as exc:
        raise PrefixcheckError(f"--radix-eviction-policy-config: not JSON ({exc})") from None
    if not isinstance(values, dict):
        raise PrefixcheckError("--radix-eviction-policy-config: must be a JSON object")
    keys = POLICY_CONFIG_KEYS.get(policy, {})
    params = {}
    for key, value in values.items():
        if key not in keys:
            known = ", ".join(keys) or "none"
            raise PrefixcheckError(
                f"--radix-eviction-policy-config: {policy} takes no {key!r} (it takes: {known})"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PrefixcheckError(
                f"--radix-eviction-policy-config: {key} must be a non-negative integer"
            )
        params[keys[key]] = value
    if policy == "tlru" and not params.get("tlru_threshold", 0) > params.get(
        "tlru_next_prompt_estimate", 0
    ):
        raise PrefixcheckError(
            "--radix-eviction-policy-config: tlru needs threshold > next_prompt_estimate"
        )
    return params


@dataclass(frozen=True)
class SchedulerFlags:
    """How requests overlap in the replay, and the engines' scheduler flags (analyze)."""

    gpu: Annotated[
        str,
        typer.Option(
            help="The GPU the servers run on, a name (H100, A100-40GB, H200, B200, L4, ...) or "
            "a memory size (80GB): picks the engines' GPU-dependent defaults.",
        ),
    ] = DEFAULT_GPU
    vllm_entry_point: Annotated[
        VllmEntryPoint,
        typer.Option(help="vLLM's entry point (its default token budget depends on it)."),
    ] = "server"
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="vLLM --max-num-batched-tokens: tokens scheduled per step with requests in "
            "flight (default: vLLM's for --gpu and --vllm-entry-point).",
        ),
    ] = None
    long_prefill_token_threshold: Annotated[
        int, typer.Option(min=0, help="vLLM --long-prefill-token-threshold (0: off).")
    ] = 0
    chunked_prefill_size: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="SGLang --chunked-prefill-size (0: off; default: SGLang's for --gpu); chunk "
            "ends become eviction units.",
        ),
    ] = None
    disable_overlap_schedule: Annotated[
        bool,
        typer.Option(
            help="SGLang --disable-overlap-schedule: a stop finish caches all outputs but the "
            "last, as a max_tokens finish does."
        ),
    ] = False
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            "--max-num-seqs",
            "--max-running-requests",
            min=1,
            help="Requests in flight, vLLM's --max-num-seqs, SGLang's --max-running-requests: "
            f"lock-step scheduling (default 1, sequential; {DEFAULT_TIMED_CONCURRENCY} with "
            "--replay-in-time).",
        ),
    ] = None
    replay_in_time: Annotated[
        bool,
        typer.Option(
            help="Replay at the log's timestamps: running requests hold their KV for a modelled "
            "prefill + decode time."
        ),
    ] = False
    prefill_tokens_per_s: Annotated[
        float, typer.Option(min=1.0, help="Time model: uncached prompt tokens per second.")
    ] = TimeModel.prefill_tokens_per_s
    decode_tokens_per_s: Annotated[
        float, typer.Option(min=0.001, help="Time model: output tokens per second per request.")
    ] = TimeModel.decode_tokens_per_s

    def __post_init__(self) -> None:
        try:
            parse_gpu(self.gpu)
        except ValueError as exc:
            raise PrefixcheckError(f"--gpu {self.gpu}: {exc}") from None
        self.settings()  # the budget against --concurrency, checked where the flags enter

    def settings(self) -> dict[str, Any]:
        """The ReplaySettings fields these flags set, GPU-dependent defaults filled in and named
        in ``assumed_defaults``."""
        timed = self.replay_in_time
        gpu = parse_gpu(self.gpu)
        assumed = []
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = vllm_max_num_batched_tokens(gpu, self.vllm_entry_point)
            assumed.append(f"vLLM --max-num-batched-tokens {budget} ({self.vllm_entry_point})")
        chunk = self.chunked_prefill_size
        if chunk is None:
            chunk = sglang_chunked_prefill_size(gpu)
            assumed.append(f"SGLang --chunked-prefill-size {chunk}")
        in_flight = self.concurrency or (DEFAULT_TIMED_CONCURRENCY if timed else 1)
        if budget < in_flight:
            if self.max_num_batched_tokens is not None:
                raise PrefixcheckError(
                    f"--max-num-batched-tokens {budget} is below --concurrency {in_flight} "
                    "(vLLM needs max_num_batched_tokens >= max_num_seqs)"
                )
            budget = in_flight
        return {
            "max_num_batched_tokens": budget,
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
            "overlap_schedule": not self.disable_overlap_schedule,
            "assumed_defaults": f"defaults for {gpu.name} ({gpu.memory_gib:g} GiB): "
            + ", ".join(assumed)
            if assumed
            else "",
            "chunked_prefill_size": chunk,
            "max_in_flight": in_flight,
            "time_model": TimeModel(self.prefill_tokens_per_s, self.decode_tokens_per_s)
            if timed
            else None,
        }


@dataclass(frozen=True)
class DiagnoseFlags:
    """What the diagnosis covers and shows (analyze)."""

    diagnose_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            help="Logs with more prompt tokens are streamed (memory follows the caches, not the "
            "log) and diagnosed on their first N tokens; fleet runs are held and diagnosed whole.",
        ),
    ] = DEFAULT_SAMPLE_TOKENS
    what_if: Annotated[
        list[str] | None,
        typer.Option(
            "--what-if",
            help="Replay a fix: pad-prefixes, move-dynamic, reorder-parts, no-salt, "
            "block-size=N, page-size=N, capacity=N, eviction-policy=P; join with + to "
            "combine; repeatable. With --replicas: router=NAME, replicas=N, session-field=F.",
        ),
    ] = None
    top: Annotated[int, typer.Option(min=0, help="Shared prefixes to show.")] = 10
    redact: Annotated[bool, typer.Option(help="Show no prompt text in reports.")] = False
    model_preset: Annotated[
        str | None,
        typer.Option(
            help=f"Model shape of the prefill estimate: {', '.join(PRESETS)} "
            f"(default {DEFAULT_ESTIMATE_PRESET}; with --measure, tiny on CPU)."
        ),
    ] = None
    diagnosis: Annotated[
        bool,
        typer.Option(
            help="Diagnose the recomputed tokens (causes, curves, bounds, recommendations); "
            "--no-diagnosis reports hit rates, the ceiling and shared prefixes only."
        ),
    ] = True
    check_curves: Annotated[
        bool,
        typer.Option(
            help="Check the capacity curves against full LRU replays (and Belady) at three "
            "capacities: one replay each."
        ),
    ] = False
    specs: tuple[WhatIfSpec, ...] = field(init=False, repr=False)
    fleet_what_if: tuple[str, ...] = field(init=False, repr=False)  # router=, replicas=, ...

    def __post_init__(self) -> None:
        texts = self.what_if or ()
        specs = tuple(WhatIfSpec.parse(t) for t in texts if not is_fleet_fix(t))
        object.__setattr__(self, "specs", specs)
        object.__setattr__(self, "fleet_what_if", tuple(t for t in texts if is_fleet_fix(t)))
        if self.model_preset is not None:
            preset(self.model_preset)
        if not self.diagnosis and (self.what_if or self.check_curves):
            raise PrefixcheckError("--what-if and --check-curves need the diagnosis")


@dataclass(frozen=True)
class OutputFlags:
    """The files a run writes (analyze); each checked writable before the run."""

    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the report as JSON (-: standard output).")
    ] = None
    markdown_path: Annotated[
        Path | None, typer.Option("--markdown", help="Write a Markdown summary (PR comments).")
    ] = None
    junit_path: Annotated[
        Path | None, typer.Option("--junit", help="Write JUnit XML, one test case per gate.")
    ] = None
    per_request: Annotated[
        Path | None, typer.Option(help="Write per-request hits (.jsonl, .csv or .parquet).")
    ] = None
    html_path: Annotated[
        Path | None, typer.Option("--html", help="Write a self-contained HTML report (charts).")
    ] = None

    def __post_init__(self) -> None:
        outputs = (
            ("json_path", "--json"),
            ("markdown_path", "--markdown"),
            ("junit_path", "--junit"),
            ("per_request", "--per-request"),
            ("html_path", "--html"),
        )
        for name, flag in outputs:
            writable(getattr(self, name), flag)
        if self.per_request == STDOUT:
            raise PrefixcheckError("--per-request -: write the table to a .jsonl, .csv or .parquet")
        dashed = [flag for name, flag in outputs if getattr(self, name) == STDOUT]
        if len(dashed) > 1:
            raise PrefixcheckError(f"{' and '.join(dashed)} both write to standard output (-)")

    @property
    def to_stdout(self) -> bool:
        """Whether a report goes to standard output (``--json -``): then nothing else does."""
        return to_stdout(self.json_path, self.markdown_path, self.junit_path, self.html_path)


@dataclass(frozen=True)
class GateFlags:
    """CI gates (analyze)."""

    fail_under: Annotated[
        str | None,
        typer.Option(
            metavar="RATE",
            help="Gate: exit 1 when a token hit rate is below RATE (0.7, 70 or 70%).",
        ),
    ] = None
    max_loss: Annotated[
        list[str] | None,
        typer.Option(help="Gate: KIND=TOKENS or KIND=PERCENT% (e.g. alignment=5%); repeatable."),
    ] = None
    engine: Annotated[GateEngine, typer.Option(help="Engines the gates check.")] = "both"
    limits: tuple[LossLimit, ...] = field(init=False, repr=False)
    rate: float | None = field(init=False, repr=False)  # --fail-under as a share

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", tuple(LossLimit.parse(t) for t in self.max_loss or ()))
        rate = None if self.fail_under is None else parse_rate(str(self.fail_under))
        object.__setattr__(self, "rate", rate)


@dataclass(frozen=True)
class ExecutorFlags:
    """Where the analysis runs (analyze)."""

    executor: Annotated[
        ExecutorName,
        typer.Option(
            help="local: this process; ray: a Ray cluster (the prefixcheck[ray] extra), the same "
            "report."
        ),
    ] = "local"
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="The Ray cluster to join (default: RAY_ADDRESS, else one started on this machine)."
        ),
    ] = None
    options: ExecutorOptions = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", ExecutorOptions(self.executor, self.ray_address))


GROUPS = (
    ReadFlags,
    CacheFlags,
    SchedulerFlags,
    DiagnoseFlags,
    OutputFlags,
    GateFlags,
    ExecutorFlags,
    FleetFlags,
)


def flag_groups(command: F) -> F:
    """Spread each flag-group parameter of ``command`` into its fields' options; build the groups
    (parsing and checking their flags) before the command runs."""
    hints = typing.get_type_hints(command, include_extras=True)
    groups: dict[str, type] = {}
    parameters = []
    for name, parameter in inspect.signature(command).parameters.items():
        hint = hints[name]
        if hint in GROUPS:
            groups[name] = hint
            fields = typing.get_type_hints(hint, include_extras=True)
            for f in dataclasses.fields(hint):
                if f.init:
                    parameters.append(
                        inspect.Parameter(
                            f.name,
                            inspect.Parameter.KEYWORD_ONLY,
                            default=f.default,
                            annotation=fields[f.name],
                        )
                    )
        else:
            parameters.append(
                parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hint)
            )

    @functools.wraps(command)
    def run(**values: Any) -> Any:
        try:
            for name, group in groups.items():
                names = [f.name for f in dataclasses.fields(group) if f.init]
                values[name] = group(**{n: values.pop(n) for n in names})
        except PrefixcheckError as exc:
            fail(Console(stderr=True), str(exc))
        return command(**values)

    del run.__wrapped__  # typer reads the signature below, not the command's
    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    return typing.cast(F, run)


UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20}
UNITS |= {"g": 2**30, "t": 2**40}


def parse_bytes(text: str, flag: str) -> int:
    """``80GiB``, ``80G`` (binary, as GPU memory is counted), ``80GB`` (decimal), ``8e10``."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    try:
        if match is None or unit not in UNITS:
            raise ValueError(text)
        value = float(match.group(1)) * UNITS[unit]
    except ValueError:
        raise PrefixcheckError(f"{flag} {text!r}: expected bytes, e.g. 80GiB or 8e10") from None
    if value <= 0:
        raise PrefixcheckError(f"{flag} {text!r}: must be positive")
    return int(value)
