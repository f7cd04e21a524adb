"""`PagePool`: the shared pool of KV-cache pages and their reference counts (host-side bookkeeping).

A sequence takes pages as it grows and returns them when it stops; the G samples of a GRPO group hold
the same prompt pages (one reference each), so a page is free again only when its last holder lets go.
The pool knows nothing of tensors: the engine maps page ids to the cache (`PagedKVCache`, one page = one
block of `page_size` token slots in every layer's K and V) and copies a shared page before a holder
writes into it (copy-on-write).
"""

from __future__ import annotations


class PagePool:
    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"PagePool needs num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}")
        self.num_pages, self.page_size = num_pages, page_size
        self.refs = [0] * num_pages
        self._free = list(range(num_pages - 1, -1, -1))     # a stack: the lowest ids are handed out first
        self.peak_used = 0

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.num_pages - len(self._free)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def alloc(self, n: int) -> list[int] | None:
        """n fresh pages (one reference each), or None (and nothing taken) when fewer than n are free."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self.refs[p] = 1
        self.peak_used = max(self.peak_used, self.used)
        return pages

    def retain(self, pages: list[int]) -> None:
        """One more holder of each page (prefix sharing)."""
        for p in pages:
            if self.refs[p] < 1:
                raise RuntimeError(f"PagePool.retain: page {p} is free")
            self.refs[p] += 1

    def release(self, pages: list[int]) -> None:
        """One holder fewer; a page with no holder left goes back to the free stack."""
        for p in pages:
            if self.refs[p] < 1:
                raise RuntimeError(f"PagePool.release: page {p} is already free (released twice?)")
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self._free.append(p)

    def shared(self, page: int) -> bool:
        return self.refs[page] > 1

    def check_empty(self) -> None:
        """Raise if any page is still held (a leak: every sequence returns its pages when it ends)."""
        held = [p for p, r in enumerate(self.refs) if r]
        if held or len(self._free) != self.num_pages:
            raise RuntimeError(f"PagePool: {len(held)} pages still held after every sequence ended: {held[:8]}")
