"""`ninfer-serve` in a subprocess with the fake engine instead of a real model.

    python tests/fake_serve.py [ninfer-serve flags...]

Runs the real `ninfer.server.cli.main` (signals, startup, logging, stop), only with
AsyncEngine.open answering a FakeEngine. FAKE_WARMUP_S makes warm-up take that long, so a
test can interrupt startup.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ninfer.engine  # noqa: E402
from fake_engine import FakeEngine  # noqa: E402
from ninfer.server import cli  # noqa: E402


class SlowWarmupEngine(FakeEngine):
    async def warmup(self, prompt_tokens: int = 1, max_tokens: int = 2) -> None:
        await asyncio.sleep(float(os.environ.get("FAKE_WARMUP_S", "0")))


ninfer.engine.AsyncEngine.open = SlowWarmupEngine.open  # type: ignore[method-assign]
cli.resolve_model = lambda model: Path(model or "fake.ninfer")  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
