"""The agent-client installer fails with a message that names the cause, never silently."""

from __future__ import annotations

import pytest

import agent_clients
from agent_clients import AgentClient, ClientUnavailable

MISSING = AgentClient("no-such-client", "@ninfer-test/no-such-client", "0.0.0", "nope")


def test_without_npm_the_message_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_AGENT_CLIENTS_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ClientUnavailable, match="npm is not on PATH"):
        agent_clients.install(MISSING)


def test_a_failed_install_names_the_package(tmp_path, monkeypatch):
    fake_npm = tmp_path / "bin" / "npm"
    fake_npm.parent.mkdir()
    fake_npm.write_text("#!/bin/sh\necho 'npm error network ENOTFOUND' >&2\nexit 1\n")
    fake_npm.chmod(0o755)
    monkeypatch.setenv("NINFER_AGENT_CLIENTS_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(fake_npm.parent))
    with pytest.raises(ClientUnavailable) as error:
        agent_clients.install(MISSING)
    message = str(error.value)
    assert "@ninfer-test/no-such-client@0.0.0 failed" in message
    assert "registry" in message and "ENOTFOUND" in message
    assert not (tmp_path / "cache" / "no-such-client-0.0.0" / ".installed").exists()


def test_a_finished_install_is_not_repeated(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_AGENT_CLIENTS_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # npm would be needed otherwise
    MISSING.executable.parent.mkdir(parents=True)
    MISSING.executable.write_text("")
    (MISSING.folder / ".installed").write_text("done\n")
    assert agent_clients.install(MISSING) == MISSING.executable
