"""The evaluation cache's signing secret (issue #50): where it lives, how it is made, and what
happens without one."""

from __future__ import annotations

import stat

import pytest

from fireviz.eval import cache


def test_the_secret_is_made_once_owner_only_outside_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_KEY_ENV, str(tmp_path / "cfg" / "eval-cache.key"))
    monkeypatch.setattr(cache, "_SECRET", {})
    mac = cache.entry_mac("k", {"length": 8, "x": 1.5})
    path = tmp_path / "cfg" / "eval-cache.key"
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == 32
    assert cache.entry_mac("k", {"x": 1.5, "length": 8}) == mac  # canonical: key order does not matter
    assert cache.entry_mac("k", {"length": 8, "x": 1.50001}) != mac
    monkeypatch.setattr(cache, "_SECRET", {})
    path.write_bytes(b"\1" * 32)  # another secret: the same entry no longer verifies
    assert cache.entry_mac("k", {"length": 8, "x": 1.5}) != mac


def test_the_default_secret_lives_in_the_users_config_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.CACHE_KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert cache.cache_secret_path() == tmp_path / "xdg" / "fireviz" / "eval-cache.key"


def test_without_a_secret_nothing_is_served_and_it_is_said_once(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv(cache.CACHE_KEY_ENV, str(blocker / "eval-cache.key"))  # under a file: cannot be made
    monkeypatch.setattr(cache, "_SECRET", {})
    with pytest.warns(RuntimeWarning, match="signing secret .* cannot be read or made"):
        assert cache.entry_mac("k", {}) is None
    assert cache.entry_mac("k", {}) is None  # said once
