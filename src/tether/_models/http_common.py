"""What the HTTP model adapters share (:mod:`.openai_compat`, :mod:`.anthropic_native`):
the default endpoint and key variable, base-URL checking, the provider's own error text,
``Retry-After`` parsing and plain copies of request values. Its own module so that one
adapter never borrows another's private helpers."""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from tether.core.records import record
from tether.errors import ConfigurationError

__all__ = [
    "DEFAULT_BASE_URL",
    "ENV_API_KEY",
    "Endpoint",
    "is_local_host",
    "parse_base_url",
    "plain",
    "provider_message",
    "retry_after_seconds",
]

DEFAULT_BASE_URL: Final = "https://openrouter.ai/api/v1"
ENV_API_KEY: Final = "TETHER_API_KEY"


@record(slots=True)
class Endpoint:
    host: str  # hostname only, lower case
    netloc: str  # host[:port], no user info
    display: str  # scheme://host[:port]/path, no user info, query or fragment
    identity_path: str  # host[:port]/path without trailing slash
    is_local: bool


def parse_base_url(base_url: str, source: str) -> Endpoint:
    try:
        parts = urlsplit(base_url.strip())
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"{source} is not a valid http(s) URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"{source} must be an http:// or https:// URL with a host "
            f"(for example {DEFAULT_BASE_URL})"
        )
    if "@" in parts.netloc:
        # Never echo the URL here: the user info is a credential.
        raise ConfigurationError(
            f"{source} must not contain user info (user:password@host): give the key "
            f"with {ENV_API_KEY} instead"
        )
    host = parts.hostname.lower()
    shown_host = f"[{host}]" if ":" in host else host
    netloc = shown_host if port is None else f"{shown_host}:{port}"
    path = parts.path.rstrip("/")
    if path.endswith("/chat/completions"):
        root = path[: -len("/chat/completions")]
        raise ConfigurationError(
            f"{source} ends in /chat/completions, which tether appends itself: use "
            f"{parts.scheme}://{netloc}{root}"
        )
    return Endpoint(
        host=host,
        netloc=netloc,
        display=f"{parts.scheme}://{netloc}{path}",
        identity_path=f"{netloc}{path}",
        is_local=is_local_host(host),
    )


def is_local_host(host: str) -> bool:
    """Loopback, private or link-local addresses and ``localhost`` names."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return (
        address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified
    )


def plain(value: Any) -> Any:
    """A deep copy as plain ``dict``/``list`` values (mappings may be read-only views)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def provider_message(body: object) -> str:
    """The provider's own error text from an error body (``{"error": {...}}`` unwrapped)."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, str):
            return inner.strip()
        if not isinstance(inner, Mapping):
            return ""
        message = inner.get("message")
        text = message.strip() if isinstance(message, str) else ""
        metadata = inner.get("metadata")
        if isinstance(metadata, Mapping):  # OpenRouter: upstream provider's own text
            raw = metadata.get("raw")
            name = metadata.get("provider_name")
            if isinstance(raw, str) and raw.strip() and raw.strip() not in text:
                label = f"{name}: " if isinstance(name, str) and name else ""
                text = f"{text} ({label}{raw.strip()})" if text else f"{label}{raw.strip()}"
        detail = inner.get("detail")
        if not text and isinstance(detail, str):  # FastAPI's own 404/405 body (LiteLLM's)
            text = detail.strip()
        if not text:
            code = inner.get("code")
            if isinstance(code, (str, int)) and not isinstance(code, bool):
                text = f"error code {code}"
        return text
    if isinstance(body, str):
        return body.strip()[:500]
    return ""


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds from ``retry-after-ms``, or ``Retry-After`` as seconds or an HTTP date."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            if name != "retry-after":
                continue
            import email.utils  # an HTTP date: rare (most servers send seconds), and ~3 ms

            try:
                when = email.utils.parsedate_to_datetime(value.strip())
            except (TypeError, ValueError, IndexError):
                continue
            if when.tzinfo is None:
                continue
            current = time.time() if now is None else now
            seconds = max(when.timestamp() - current, 0.0)
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None
