"""Decoder shapes: the presets, a Hugging Face ``config.json`` reader, and the per-token costs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from analyzer.errors import PrefixcheckError

# Hugging Face architectures the torch model implements (Mistral is Llama with other sizes).
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's ``rope_scaling`` of type ``llama3`` (long-context frequency scaling)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelShape:
    """A Llama-family decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

    name: str
    architecture: str  # "llama" or "qwen2" (q/k/v projections with biases)
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool = False
    rope_scaling: RopeScaling | None = None
    full_layers: int | None = None  # the model's own depth when only a subset is built

    @property
    def qkv_bias(self) -> bool:
        return self.architecture == "qwen2"

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer (the matrices every token goes through, norms included)."""
        q = self.n_heads * self.head_dim
        kv = self.n_kv_heads * self.head_dim
        attention = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        bias = q + 2 * kv if self.qkv_bias else 0
        mlp = 3 * self.hidden_size * self.intermediate_size
        return attention + bias + mlp + 2 * self.hidden_size

    @property
    def params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embeddings
        return self.n_layers * self.layer_params + embeddings + head + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of K and V one token holds in the cache, over all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes

    def with_layers(self, layers: int | None) -> ModelShape:
        """The same shape cut to its first ``layers`` decoder layers (None: all of them)."""
        if layers is None or layers == self.n_layers:
            return self
        if not 1 <= layers <= self.n_layers:
            raise PrefixcheckError(
                f"--layers must be between 1 and {self.n_layers} for {self.name}"
            )
        return replace(self, n_layers=layers, full_layers=self.full_layers or self.n_layers)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["params"] = self.params
        return data

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str) -> ModelShape:
        """Read a Hugging Face ``config.json`` of a Llama, Mistral or Qwen2 model."""
        architectures = config.get("architectures") or []
        kind = next((ARCHITECTURES[a] for a in architectures if a in ARCHITECTURES), None)
        if kind is None:
            supported = ", ".join(ARCHITECTURES)
            raise PrefixcheckError(
                f"{name}: architecture {architectures or 'missing'} is not supported ({supported})"
            )
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            return cls(
                name=name,
                architecture=kind,
                hidden_size=hidden,
                n_layers=int(config["num_hidden_layers"]),
                n_heads=heads,
                n_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                rope_theta=float(config.get("rope_theta", 10000.0)),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                rope_scaling=_rope_scaling(config.get("rope_scaling"), name),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PrefixcheckError(f"{name}: config.json lacks a usable {exc}") from None


def _rope_scaling(scaling: Any, name: str) -> RopeScaling | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind == "default":
        return None
    if kind != "llama3":
        raise PrefixcheckError(f"{name}: rope_scaling type {kind!r} is not supported (llama3)")
    return RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )


_LLAMA3_ROPE = RopeScaling(8.0, 1.0, 4.0, 8192)

# fmt: off
_SHAPES = [
    #           name           arch    hidden layers heads kv head inter  vocab   rope_theta eps
    ModelShape("llama-3.1-8b", "llama", 4096, 32,    32,   8, 128, 14336, 128256, 5e5,       1e-5,
               rope_scaling=_LLAMA3_ROPE),
    ModelShape("llama-3.1-70b", "llama", 8192, 80,   64,   8, 128, 28672, 128256, 5e5,       1e-5,
               rope_scaling=_LLAMA3_ROPE),
    ModelShape("qwen2.5-7b",   "qwen2", 3584, 28,    28,   4, 128, 18944, 152064, 1e6,       1e-6),
    ModelShape("mistral-7b",   "llama", 4096, 32,    32,   8, 128, 14336, 32768,  1e6,       1e-5),
    # A CPU-sized Llama for tests: every code path of the big ones, in milliseconds.
    ModelShape("tiny",         "llama", 64,   2,     4,    2, 16,  128,   512,    1e4,       1e-5),
]
# fmt: on
PRESETS: dict[str, ModelShape] = {shape.name: shape for shape in _SHAPES}

DEFAULT_ESTIMATE_PRESET = "llama-3.1-8b"


def preset(name: str) -> ModelShape:
    """The shape named ``name``; an unknown name is a user error."""
    try:
        return PRESETS[name]
    except KeyError:
        raise PrefixcheckError(
            f"unknown --model-preset {name!r} (choose from {', '.join(PRESETS)})"
        ) from None
