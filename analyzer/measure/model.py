"""A Llama-family decoder in plain torch, named as Hugging Face names its weights, with a KV cache.

RMSNorm, rotary embeddings (Llama 3.1's frequency scaling included), grouped-query attention
through ``scaled_dot_product_attention`` and a SwiGLU MLP. ``Decoder.prefill`` runs new tokens on
top of whatever the cache holds before them and returns the last position's logits, as an engine's
prefill does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from analyzer.measure.presets import ModelShape

INIT_STD = 0.02  # random weights: N(0, 0.02²) as Llama's initializer_range, norms at 1


class KVCache:
    """Preallocated K and V for every layer, and the rotary tables for as many positions."""

    def __init__(self, shape: ModelShape, device: torch.device, dtype: torch.dtype) -> None:
        self.shape, self.device, self.dtype = shape, device, dtype
        self.capacity = 0
        self.k = self.v = self.cos = self.sin = torch.empty(0)

    def reserve(self, tokens: int) -> None:
        """Room for ``tokens`` positions (allocates only when it grows; never while timed)."""
        if tokens <= self.capacity:
            return
        self.release()
        s = self.shape
        size = (s.n_layers, s.n_kv_heads, tokens, s.head_dim)
        self.k = torch.empty(size, device=self.device, dtype=self.dtype)
        self.v = torch.empty(size, device=self.device, dtype=self.dtype)
        self.cos, self.sin = _rotary_tables(s, tokens, self.device, self.dtype)
        self.capacity = tokens

    def release(self) -> None:
        self.k = self.v = self.cos = self.sin = torch.empty(0)
        self.capacity = 0


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As Hugging Face does it: normalise in fp32, scale in the model's dtype."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        q, kv = shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
        self.q_proj = nn.Linear(shape.hidden_size, q, bias=shape.qkv_bias)
        self.k_proj = nn.Linear(shape.hidden_size, kv, bias=shape.qkv_bias)
        self.v_proj = nn.Linear(shape.hidden_size, kv, bias=shape.qkv_bias)
        self.o_proj = nn.Linear(q, shape.hidden_size, bias=False)
        self.n_heads, self.n_kv_heads, self.head_dim = (
            shape.n_heads,
            shape.n_kv_heads,
            shape.head_dim,
        )

    def forward(self, x: torch.Tensor, start: int, cache: KVCache, layer: int) -> torch.Tensor:
        n, end = x.shape[0], start + x.shape[0]
        cos, sin = cache.cos[start:end], cache.sin[start:end]
        q = _rotate(self.q_proj(x).view(n, self.n_heads, self.head_dim), cos, sin)
        k = _rotate(self.k_proj(x).view(n, self.n_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(n, self.n_kv_heads, self.head_dim)
        cache.k[layer, :, start:end].copy_(k.transpose(0, 1))
        cache.v[layer, :, start:end].copy_(v.transpose(0, 1))
        keys, values = cache.k[layer, :, :end].unsqueeze(0), cache.v[layer, :, :end].unsqueeze(0)
        queries = q.transpose(0, 1).unsqueeze(0)
        if start == 0:
            out = F.scaled_dot_product_attention(
                queries, keys, values, is_causal=True, enable_gqa=True
            )
        else:  # the new tokens sit at the end of the keys: causal aligned to the lower right
            mask = causal_lower_right(n, end)
            out = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=mask, enable_gqa=True
            )
        return self.o_proj(out[0].transpose(0, 1).reshape(n, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = MLP(shape)

    def forward(self, h: torch.Tensor, start: int, cache: KVCache, layer: int) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), start, cache, layer)
        return h + self.mlp(self.post_attention_layernorm(h))


class Body(nn.Module):
    """Hugging Face's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.n_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class Decoder(nn.Module):
    """``*ForCausalLM``: state-dict names match the Hugging Face checkpoints."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        self.model = Body(shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embeddings with the LM head when the model ties them."""
        if self.shape.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def prefill(self, token_ids: torch.Tensor, start: int, cache: KVCache) -> torch.Tensor:
        """Prefill ``token_ids`` at positions ``start...`` over the cached ``[0, start)``; the
        last position's logits (fp32). Writes the new tokens' K and V into ``cache``."""
        h = self.model.embed_tokens(token_ids)
        for index, layer in enumerate(self.model.layers):
            h = layer(h, start, cache, index)
        return self.lm_head(self.model.norm(h[-1:]))[0].float()


def empty_decoder(shape: ModelShape, device: torch.device, dtype: torch.dtype) -> Decoder:
    """A decoder with uninitialised weights on ``device`` (no time spent on a default init)."""
    with torch.device("meta"):
        decoder = Decoder(shape).to(dtype)
    decoder = decoder.to_empty(device=device)
    decoder.tie_weights()
    return decoder.eval()


def random_decoder(
    shape: ModelShape, device: torch.device, dtype: torch.dtype, seed: int
) -> Decoder:
    """Seeded random weights: N(0, INIT_STD²) matrices and biases, unit norm weights."""
    decoder = empty_decoder(shape, device, dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, INIT_STD, generator=generator)
    return decoder


def _rotary_tables(
    shape: ModelShape, positions: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, ``[positions, 1, head_dim]``, in Hugging Face's half-rotation layout (computed
    in fp32 like the engines, then cast)."""
    inv_freq = 1.0 / shape.rope_theta ** (
        torch.arange(0, shape.head_dim, 2, device=device, dtype=torch.float32) / shape.head_dim
    )
    if shape.rope_scaling is not None:
        inv_freq = _llama3_scaled(inv_freq, shape)
    angles = torch.outer(torch.arange(positions, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _llama3_scaled(inv_freq: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """Llama 3.1's rope scaling: low frequencies divided by ``factor``, a smooth band between."""
    scaling = shape.rope_scaling
    assert scaling is not None
    old_context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    low_wavelength = old_context / scaling.low_freq_factor
    high_wavelength = old_context / scaling.high_freq_factor
    smooth = (old_context / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = torch.where(wavelength > low_wavelength, inv_freq / scaling.factor, inv_freq)
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return torch.where(medium, blended, scaled)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
