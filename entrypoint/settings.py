"""How a setting's value is read from the environment: one rule for every flag and every duration, each bad
value one ConfigError line naming the variable."""

from __future__ import annotations

from collections.abc import Mapping

from .errors import ConfigError


def flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = env.get(name, "").strip().lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={env[name]!r}: expected 1 or 0")


def seconds(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum:g}")
    return value
