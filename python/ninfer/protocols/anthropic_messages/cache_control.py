"""`cache_control` markers: validated, counted, and kept as prefix-cache write candidates.

Block-level ephemeral markers (on tools, System blocks, message blocks and tool results) are
explicit breakpoints; at most four distinct ones are accepted. A request-level marker targets
the last cacheable block: it merges with an explicit marker there when the TTLs agree,
conflicts when they differ, and otherwise needs a free fifth slot. The markers never change
the prompt; they only say where a shared prefix may be written (the prefix cache reads
`CacheBreakpoints.targets`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.prompt import cache_marks
from ninfer.server.errors import invalid

MAX_BREAKPOINTS = 4
TTLS = ("5m", "1h")


def parse_marker(marker: Any, where: str) -> str:
    """The TTL of a valid ephemeral marker at `where` (the marker's own field path)."""
    if not isinstance(marker, dict):
        raise invalid("`cache_control` must be an object", where, "invalid_type")
    kind = marker.get("type")
    if kind != "ephemeral":
        raise invalid(f"cache_control type must be `ephemeral`, got {kind!r}", f"{where}.type")
    ttl = marker.get("ttl", "5m")
    if ttl not in TTLS:
        raise invalid(f"cache_control ttl must be `5m` or `1h`, got {ttl!r}", f"{where}.ttl")
    return ttl


@dataclass(slots=True)
class CacheBreakpoints:
    """Explicit breakpoints by block location (`tools[2]`, `messages[4].content[0]`)."""

    targets: dict[str, str] = field(default_factory=dict)  # location -> ttl
    last_block: str | None = None  # the last cacheable block, for a request-level marker
    marked: list[str] = field(default_factory=list)  # mark number -> block location

    def mark(self, location: str) -> str:
        """The mark that ends block `location`'s text in the prompt content (see
        ninfer.prompt.cache_marks); the prompt path removes it again."""
        self.marked.append(location)
        return cache_marks.mark(len(self.marked) - 1)

    def candidates(self, frontiers: list[tuple[int, int]]) -> list[int]:
        """The breakpoints' exact token frontiers in the rendered prompt, ascending; a target
        whose boundary is not a token boundary (or not text, like a tool) is left out."""
        wanted = set(self.targets)
        return sorted(
            {at for n, at in frontiers if n < len(self.marked) and self.marked[n] in wanted}
        )

    def block(self, block: dict[str, Any], location: str) -> None:
        """Records `block`'s marker (if any) and makes it the last cacheable block."""
        self.last_block = location
        marker = block.get("cache_control")
        if marker is None:
            return
        self.targets[location] = parse_marker(marker, f"{location}.cache_control")
        if len(self.targets) > MAX_BREAKPOINTS:
            raise invalid(
                f"at most {MAX_BREAKPOINTS} blocks may carry cache_control; this is the "
                f"{len(self.targets)}th",
                f"{location}.cache_control",
            )

    def request_level(self, marker: Any) -> None:
        if marker is None:
            return
        ttl = parse_marker(marker, "cache_control")
        target = self.last_block
        if target is None:
            return  # nothing cacheable: an advisory hint without a boundary
        existing = self.targets.get(target)
        if existing is not None:
            if existing != ttl:
                raise invalid(
                    f"the request-level cache_control (ttl {ttl}) targets {target}, whose own "
                    f"cache_control has ttl {existing}",
                    "cache_control",
                )
            return
        if len(self.targets) >= MAX_BREAKPOINTS:
            raise invalid(
                f"the request-level cache_control needs a breakpoint slot, but {MAX_BREAKPOINTS} "
                "blocks already carry cache_control",
                "cache_control",
            )
        self.targets[target] = ttl
