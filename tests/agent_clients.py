"""The agent clients our users run (Claude Code, Codex CLI, Qwen Code), installed from npm and
pointed at a loopback ninfer-serve.

    python tests/agent_clients.py install     # what .ci/run does before pytest

Each client is installed once, at a pinned version, into its own folder of a cache
($NINFER_AGENT_CLIENTS_DIR, default ~/.cache/ninfer/agent-clients), never into the repository;
a stamp file marks a finished install, so a warm cache costs nothing. Each run gets a fresh
HOME in a temporary folder, configuration files that point at the server and turn telemetry,
update checks and error reporting off, and an environment with nothing from the caller's
beyond PATH and the locale.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

API_KEY = "sk-ninfer-agent-test"


@dataclass(frozen=True)
class AgentClient:
    name: str
    package: str
    version: str
    command: str  # the executable the package installs

    @property
    def folder(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"

    @property
    def executable(self) -> Path:
        return self.folder / "node_modules" / ".bin" / self.command


CLAUDE_CODE = AgentClient("claude-code", "@anthropic-ai/claude-code", "2.1.332", "claude")
CODEX = AgentClient("codex", "@openai/codex", "0.171.0", "codex")
QWEN_CODE = AgentClient("qwen-code", "@qwen-code/qwen-code", "0.24.4", "qwen")
CLIENTS = (CLAUDE_CODE, CODEX, QWEN_CODE)


class ClientUnavailable(RuntimeError):
    """A client could not be installed: no npm, no registry, or a failed install."""


def cache_root() -> Path:
    configured = os.environ.get("NINFER_AGENT_CLIENTS_DIR")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "ninfer" / "agent-clients"


def install(client: AgentClient, timeout_s: float = 300) -> Path:
    """The client's executable, installing the pinned version first if the cache lacks it."""
    stamp = client.folder / ".installed"
    if stamp.is_file() and client.executable.exists():
        return client.executable
    npm = shutil.which("npm")
    if npm is None:
        raise ClientUnavailable(
            f"{client.package}@{client.version}: npm is not on PATH (node >= 20 and npm are "
            "needed to test against the real agent clients)"
        )
    client.folder.mkdir(parents=True, exist_ok=True)
    with open(client.folder.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second test process waits for the first install
        if stamp.is_file() and client.executable.exists():
            return client.executable
        argv = [
            npm,
            "install",
            "--prefix",
            str(client.folder),
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--loglevel=error",
            f"{client.package}@{client.version}",
        ]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, env=_npm_env()
            )
        except subprocess.TimeoutExpired:
            raise ClientUnavailable(
                f"npm install {client.package}@{client.version} did not finish in "
                f"{timeout_s:.0f} s: is the npm registry reachable?"
            ) from None
        if done.returncode != 0 or not client.executable.exists():
            raise ClientUnavailable(
                f"npm install {client.package}@{client.version} failed (exit "
                f"{done.returncode}); is the npm registry reachable?\n{done.stderr[-2000:]}"
            )
        stamp.write_text(f"{client.package}@{client.version}\n")
    return client.executable


def _npm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(NPM_CONFIG_UPDATE_NOTIFIER="false", NPM_CONFIG_FUND="false")
    return env


def base_env(home: Path) -> dict[str, str]:
    """What every client run starts from: a private HOME and nothing else of the caller's."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        "TMPDIR": str(home / "tmp"),
    }
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return env


def claude_code_env(home: Path, base_url: str, api_key: str = API_KEY) -> dict[str, str]:
    """Claude Code against `base_url` (no /v1: the client appends /v1/messages itself)."""
    env = base_env(home)
    env.update(
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY=api_key,
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return env


def qwen_code_env(home: Path, base_url: str, model: str, api_key: str = API_KEY) -> dict[str, str]:
    """Qwen Code against `base_url` + /v1 (Chat Completions)."""
    settings = home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(
        json.dumps({"privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}})
    )
    env = base_env(home)
    env.update(
        OPENAI_BASE_URL=base_url + "/v1",
        OPENAI_API_KEY=api_key,
        OPENAI_MODEL=model,
        QWEN_TELEMETRY_ENABLED="false",
        QWEN_CODE_SUPPRESS_YOLO_WARNING="1",
    )
    return env


CODEX_CONFIG = """\
model = "{model}"
model_provider = "ninfer"
check_for_update_on_startup = false

[model_providers.ninfer]
name = "NInfer"
base_url = "{base_url}/v1"
env_key = "NINFER_API_KEY"
wire_api = "responses"

[analytics]
enabled = false
"""


def codex_env(home: Path, base_url: str, model: str, api_key: str = API_KEY) -> dict[str, str]:
    """Codex CLI against `base_url` + /v1 (Responses), through a config.toml provider entry."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=model, base_url=base_url))
    env = base_env(home)
    env.update(CODEX_HOME=str(codex_home), NINFER_API_KEY=api_key)
    return env


def run_client(
    argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a client to completion with no terminal and no stdin (as CI does)."""
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def main(args: list[str]) -> int:
    if args != ["install"]:
        print(__doc__)
        return 2
    for client in CLIENTS:
        try:
            path = install(client)
        except ClientUnavailable as error:
            print(error, file=sys.stderr)
            return 1
        print(f"{client.package}@{client.version}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
