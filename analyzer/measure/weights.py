"""A decoder from a local Hugging Face folder: config.json and *.safetensors (never pickle)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from analyzer.errors import PrefixcheckError
from analyzer.measure.model import Decoder, empty_decoder
from analyzer.measure.presets import ModelShape

_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry; recomputed here


def read_shape(folder: Path, layers: int | None) -> ModelShape:
    """The shape in ``folder/config.json``, cut to ``layers`` when given."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PrefixcheckError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    if not isinstance(config, dict):
        raise PrefixcheckError(f"{path}: not a JSON object")
    return ModelShape.from_hf_config(config, folder.name).with_layers(layers)


def load_decoder(
    folder: Path, shape: ModelShape, device: torch.device, dtype: torch.dtype
) -> Decoder:
    """``shape``'s decoder with the folder's weights (layers past ``shape.n_layers`` left out)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise PrefixcheckError(
            f"{folder}: no *.safetensors files (pickle checkpoints are not read)"
        )
    decoder = empty_decoder(shape, device, dtype)
    params = dict(decoder.named_parameters())
    loaded: set[str] = set()
    for file in files:
        loaded |= _load_file(file, shape, params, device)
    missing = sorted(set(params) - loaded)
    if missing:
        raise PrefixcheckError(
            f"{folder}: weights missing from the safetensors files: {missing[:3]}"
        )
    return decoder


@torch.no_grad()
def _load_file(
    file: Path, shape: ModelShape, params: dict[str, torch.nn.Parameter], device: torch.device
) -> set[str]:
    """Copy one file's tensors into ``params``; the names loaded."""
    loaded = set()
    try:
        with safe_open(str(file), framework="pt", device=str(device)) as tensors:
            for name in tensors.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if not _wanted(name, shape):
                    continue
                if name not in params:
                    raise PrefixcheckError(
                        f"{file}: unexpected tensor {name!r} for a {shape.architecture} model"
                    )
                _copy(params[name], tensors.get_tensor(name), file, name)
                loaded.add(name)
    except SafetensorError as exc:
        raise PrefixcheckError(f"{file}: not a readable safetensors file ({exc})") from None
    return loaded


def _wanted(name: str, shape: ModelShape) -> bool:
    """Whether to load ``name``: not a layer cut off by ``--layers``, not an ignored buffer."""
    layer = _LAYER.match(name)
    if layer and int(layer.group(1)) >= shape.n_layers and shape.full_layers is not None:
        return False
    return not name.endswith(_IGNORED) and not (
        name == "lm_head.weight" and shape.tie_word_embeddings
    )


def _copy(param: torch.nn.Parameter, tensor: torch.Tensor, file: Path, name: str) -> None:
    if tuple(tensor.shape) != tuple(param.shape):
        raise PrefixcheckError(
            f"{file}: {name} has shape {tuple(tensor.shape)}, config.json implies "
            f"{tuple(param.shape)}"
        )
    param.copy_(tensor)
