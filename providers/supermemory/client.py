"""The Supermemory API through the official ``supermemory`` SDK (v5, namespace-first).

The calls mnemo makes (``Authorization: Bearer <key>``; the namespace is in the path):

* ``POST /ns/{namespace}/document`` — ``client.add``: one document ``{content, id,
  metadata}``; Supermemory extracts memories from it. Re-sending the same ``id`` with
  the same content is an unchanged duplicate (``status: done``), never a second copy;
* ``POST /ns/{namespace}/search`` — ``client.search``: ``{query, limit, searchMode}``
  → ``{"results": [{"memory" | "chunk": …, "similarity": …}], "searchTime": …}``;
* ``POST /ns/{namespace}/profile`` — ``client.profile`` → ``{"profile": {"static":
  [{id, memory}], "dynamic": […], "buckets": {name: […]}}}``;
* ``DELETE /ns/{namespace}`` — ``client.namespaces.delete``: every document and memory
  of the namespace, permanently.

A namespace (v3/v4 called it a *container tag*) is Supermemory's isolation boundary:
one per mnemo user, built by ``namespace_for`` and passed to every call — there is no
default namespace. SDK errors are mapped here, in one place: 429 and 5xx become
``RetryLater`` (with the server's ``Retry-After``), everything else ``ProviderError``
with a one-line reason (never the request headers, which carry the key). The SDK's own
retries are off: the job queue retries writes, and a prefetch must not wait.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mnemo.memory.durable import RetryLater
from mnemo.memory.errors import ProviderError

DEFAULT_URL = "https://api.supermemory.ai"
SEARCH_MODES = ("hybrid", "memories", "chunks")
NAMESPACE_MAX = 100  # Supermemory: ^[A-Za-z0-9_:-]+$, at most 100 characters
PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]{0,40}$")
_ALLOWED = re.compile(r"[A-Za-z0-9_:-]+")
_REFUSED = re.compile(r"[^A-Za-z0-9_:-]")


def namespace_for(prefix: str, user_id: str) -> str:
    """The user's namespace: ``<prefix>:<user id>``, injective over user ids.

    An id Supermemory accepts as it is (and without ``--``) is used unchanged
    (``mnemo:telegram:42``). Any other — a character Supermemory refuses, ``--``, or too
    long — becomes a readable head, ``--`` and a hash of the whole id: unchanged ids never
    contain ``--``, so no id can be chosen to land in another user's namespace."""
    if not user_id:
        raise ProviderError("supermemory: a namespace needs a user id")
    head = f"{prefix}:" if prefix else ""
    if _ALLOWED.fullmatch(user_id) and "--" not in user_id and len(head) + len(user_id) <= NAMESPACE_MAX:
        return head + user_id
    digest = hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    readable = _REFUSED.sub("_", user_id)[: NAMESPACE_MAX - len(head) - 2 - len(digest)]
    return f"{head}{readable}--{digest}"


@dataclass(frozen=True, slots=True)
class Profile:
    static: list[str]
    dynamic: list[str]
    buckets: dict[str, list[str]]

    def as_dict(self) -> dict[str, Any]:
        return {"static": self.static, "dynamic": self.dynamic, "buckets": self.buckets}


def _unexpected(what: str, body: Any) -> ProviderError:
    return ProviderError(f"supermemory {what}: unexpected answer: {str(body)[:200]}")


def _facts(items: Any, what: str) -> list[str]:
    if not isinstance(items, list):
        raise _unexpected(what, items)
    return [m for m in (getattr(i, "memory", None) for i in items) if isinstance(m, str) and m.strip()]


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = {k.lower(): v for k, v in (headers or {}).items()}.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class SupermemoryClient:
    """Synchronous (the provider hooks run in worker threads); one SDK client, whose
    httpx client is thread-safe, for the whole process."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float) -> None:
        from supermemory import Supermemory

        self.base_url = (base_url or DEFAULT_URL).rstrip("/")
        self.timeout_s = timeout_s
        self._sdk = Supermemory(base_url=self.base_url, api_key=api_key, timeout=timeout_s, max_retries=0)

    def close(self) -> None:
        self._sdk.close()

    def _call(self, what: str, fn: Callable[[], Any], *, absent_ok: bool = False) -> Any:
        import supermemory
        from supermemory.core.parse_error import ParsingError

        try:
            return fn()
        except supermemory.APIStatusError as e:
            status = e.status_code or 0
            if absent_ok and status == 404:
                return None
            if status == 429 or status >= 500:
                raise RetryLater(f"supermemory {what}: HTTP {status}", _retry_after(e.headers)) from None
            if 200 <= status < 300:  # the SDK could not decode a success answer
                raise ProviderError(f"supermemory {what}: not JSON: {str(e.body)[:200]}") from None
            raise ProviderError(f"supermemory {what}: HTTP {status}: {str(e.body)[:200]}") from None
        except supermemory.APITimeoutError:
            raise ProviderError(f"supermemory {what}: timed out after {self.timeout_s:g} s") from None
        except supermemory.APIConnectionError as e:
            cause = e.__cause__ or e
            raise ProviderError(f"supermemory {what}: {type(cause).__name__}: {cause}") from None
        except (ParsingError, supermemory.APIResponseValidationError) as e:
            raise _unexpected(what, e.body) from None
        except (TypeError, ValueError, AttributeError) as e:  # the SDK building its model from a wrong shape
            raise ProviderError(f"supermemory {what}: unexpected answer ({type(e).__name__})") from None

    # --- the API, always with an explicit namespace ------------------------------------
    def add(self, namespace: str, content: str, *, doc_id: str, metadata: Mapping[str, str]) -> str:
        """Store one document; returns its processing status (``queued``, ``done``, …)."""
        ref = self._call(
            "add", lambda: self._sdk.add(namespace, content=content, id=doc_id, metadata=dict(metadata))
        )
        status = getattr(ref, "status", None)
        if not isinstance(status, str):
            raise _unexpected("add", ref)
        return status

    def search(self, namespace: str, query: str, *, limit: int, mode: str) -> list[str]:
        """The texts of the namespace's best matches: learned memories and source chunks."""
        answer = self._call(
            "search", lambda: self._sdk.search(namespace, query=query, limit=limit, search_mode=mode)
        )
        results = getattr(answer, "results", None)
        if not isinstance(results, list):
            raise _unexpected("search", answer)
        out: list[str] = []
        for r in results:
            text = getattr(r, "memory", None) or getattr(r, "chunk", None)
            if isinstance(text, str) and text.strip() and text not in out:
                out.append(text)
        return out[:limit]

    def profile(self, namespace: str) -> Profile:
        answer = self._call("profile", lambda: self._sdk.profile(namespace))
        profile = getattr(answer, "profile", None)
        buckets = getattr(profile, "buckets", None) or {}
        if not isinstance(buckets, dict):
            raise _unexpected("profile", answer)
        return Profile(
            _facts(getattr(profile, "static", []), "profile"),
            _facts(getattr(profile, "dynamic", []), "profile"),
            {str(k): _facts(v, "profile") for k, v in buckets.items()},
        )

    def delete_namespace(self, namespace: str) -> None:
        """Permanently delete everything in the namespace; one that never existed is
        already gone."""
        self._call("delete namespace", lambda: self._sdk.namespaces.delete(namespace), absent_ok=True)
