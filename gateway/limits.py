"""Per-tenant concurrency: a caller over its limit gets 429 with Retry-After, never a queue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.errors import ApiError


class ConcurrencyLimiter:
    def __init__(self, per_key: int) -> None:
        self._per_key = per_key
        self._active: dict[str, int] = {}

    @asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        active = self._active.get(tenant, 0)
        if active >= self._per_key:
            raise ApiError(429, f"too many concurrent requests for this API key (limit {self._per_key})",
                           "rate_limit_error", retry_after=1)
        self._active[tenant] = active + 1
        try:
            yield
        finally:
            self._active[tenant] -= 1
            if not self._active[tenant]:
                del self._active[tenant]
