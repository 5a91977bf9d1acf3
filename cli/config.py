"""Settings from ``prefixcheck.toml`` or ``[tool.prefixcheck]`` in ``pyproject.toml``; flags win.

Top-level keys are defaults for every command that has that option (``block-size = 32``); a table
named after a command holds keys for it alone (``[tool.prefixcheck.lint]``). Keys are the long
flag names, with dashes or underscores.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from analyzer.errors import PrefixcheckError

CONFIG_FILE = "prefixcheck.toml"


def find_config(start: Path) -> Path | None:
    """The config in ``start``: prefixcheck.toml, else pyproject.toml with [tool.prefixcheck]."""
    if (start / CONFIG_FILE).is_file():
        return start / CONFIG_FILE
    pyproject = start / "pyproject.toml"
    if pyproject.is_file() and _names_prefixcheck(pyproject):
        return pyproject
    return None


def _names_prefixcheck(pyproject: Path) -> bool:
    """Whether a pyproject.toml has a [tool.prefixcheck] table. Another project's broken file
    is not ours to judge: invalid TOML is an error only when it mentions that table."""
    try:
        return "prefixcheck" in _read(pyproject).get("tool", {})
    except PrefixcheckError:
        try:
            text = pyproject.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        if re.search(r"^\s*\[\s*tool\s*\.\s*prefixcheck\b|^\s*prefixcheck\s*[.=]", text, re.M):
            raise
        return False


def default_map(path: Path, commands: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-command default map (click's) built from the file; unknown keys are errors."""
    table = _read(path)
    if path.name == "pyproject.toml":
        table = table.get("tool", {}).get("prefixcheck", {})
    shared = {key: value for key, value in table.items() if not isinstance(value, dict)}
    per_command = {key: value for key, value in table.items() if isinstance(value, dict)}
    for name in per_command:
        if name not in commands:
            raise PrefixcheckError(f"{path}: [{name}] is not a prefixcheck command")
    defaults: dict[str, dict[str, Any]] = {}
    known_anywhere: set[str] = set()
    for name, command in commands.items():
        params = _option_names(command)
        known_anywhere |= set(params)
        values = {
            params[_flag(key)]: value for key, value in shared.items() if _flag(key) in params
        }
        for key, value in per_command.get(name, {}).items():
            if _flag(key) not in params:
                raise PrefixcheckError(f"{path}: [{name}] has no option {key!r}")
            values[params[_flag(key)]] = value
        defaults[name] = values
    for key in shared:
        if _flag(key) not in known_anywhere:
            raise PrefixcheckError(f"{path}: unknown setting {key!r}")
    return defaults


def _option_names(command: Any) -> dict[str, str]:
    """Long flag name (``fail-under``, ``json``) -> parameter (``fail_under``, ``json_path``)."""
    names = {}
    for param in command.params:
        if getattr(param, "param_type_name", None) != "option" or getattr(param, "hidden", False):
            continue  # hidden options (old names) take no settings
        for opt in param.opts:
            if opt.startswith("--"):
                names[opt[2:]] = param.name
    return names


def _flag(key: str) -> str:
    return key.replace("_", "-")


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PrefixcheckError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PrefixcheckError(f"{path}: invalid TOML ({exc})") from None
