"""What runner treats as a secret, and the one way a secret is kept out of text.

Secrets (Hugging Face tokens, API keys, passwords) come from the environment only,
by name. They can still arrive by mistake: credentials inside a URL
(``tracking.uri=http://user:pass@host``, ``backend.url=...?token=...``), a secret
under a secret-looking name in ``engine.env``, or a key typed where a variable
*name* belongs (``engine.api_key_env``). :func:`redact` is applied to everything
runner shows or stores (MLflow params and tags, manifest.json, the resolved
config, console lines, log records, error paragraphs); the shape checks let the
entry point refuse such input before Hydra writes or prints anything.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# A name with one of these in it holds a secret (HF_TOKEN, OPENAI_API_KEY, ...).
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
HIDDEN = "***"

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_USERINFO = re.compile(r"(://)[^/?#\s@]*@")
# A query parameter whose name says it carries a credential: token, api_key,
# X-Amz-Signature, sig, password, auth, ...
_SECRET_QUERY = re.compile(
    r"([?&;][^=&#\s]*(?:token|key|secret|pass|sig|auth|cred)[^=&#\s]*=)[^&#\s]*", re.IGNORECASE
)
API_KEY_VARIABLE = "VLLM_API_KEY"
HF_TOKEN_VARIABLE = "HF_TOKEN"
# Secrets runner hands to the engine only when the plan names them; a local engine
# does not inherit them from runner's environment otherwise.
MANAGED_SECRETS = (API_KEY_VARIABLE, HF_TOKEN_VARIABLE, "HUGGING_FACE_HUB_TOKEN")
_TRUE = {"1", "true", "yes", "on"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def hub_offline(env: dict[str, str]) -> bool:
    """Whether huggingface_hub in an engine with environment ``env`` stays offline (so
    an HF token would have nothing to do there)."""
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def is_secret_name(name: str) -> bool:
    """Whether an environment variable (or map key) named ``name`` holds a secret."""
    return any(marker in name.upper() for marker in SECRET_MARKERS)


def is_env_name(value: str) -> bool:
    """Whether ``value`` has the shape of an environment variable name (not of a key)."""
    return bool(_ENV_NAME.match(value))


def _redact_url(match: re.Match[str]) -> str:
    url = _USERINFO.sub(rf"\g<1>{HIDDEN}@", match.group(0))
    return _SECRET_QUERY.sub(rf"\g<1>{HIDDEN}", url)


def redact(text: str) -> str:
    """``text`` with every URL's user:password and credential query values replaced by ***."""
    return _URL.sub(_redact_url, text) if "://" in text else text


def has_credentials(text: str) -> bool:
    """Whether ``text`` holds a URL with credentials in it."""
    return redact(text) != text


def redact_data(value: Any) -> Any:
    """:func:`redact` applied to every string in nested dicts, lists and tuples."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_data(item) for item in value)
    return value


class RedactingFilter(logging.Filter):
    """A log handler filter: the formatted record, URLs redacted, whoever logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "://" in message:
            record.msg, record.args = redact(message), None
        return True
