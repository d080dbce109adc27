"""What every part of the configuration shares: strict models and the precisions."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

Precision = Literal["fp32", "bf16", "fp16", "fp8", "nvfp4", "nvfp4a16", "int4"]


class Strict(BaseModel):
    # inf and nan are refused everywhere: `search.window_s=inf` would never end a window.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be parsed (an unclosed IPv6 bracket, a port that is no number), or None."""
    try:
        _ = urlsplit(url).port  # reading the port is what checks it
    except ValueError:
        return (
            "is not a URL runner can read: check the brackets around an IPv6 address "
            "(http://[::1]:8000) and that the port is a number"
        )
    return None


def as_text(value: Any) -> Any:
    """A scalar as the text a command line or environment holds; anything else as is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value
