"""Every Settings field is a documented `serve` flag and a README row, from one table."""

from __future__ import annotations

import re
import subprocess
import typing

import msgspec
import pytest
from cli_support import ROOT, cli, env

from frink_mlx.cli.flags import (
    default_text,
    env_name,
    flag_names,
    readme_section,
    setting_fields,
    settings_markdown,
)
from frink_mlx.cli.main import build_parser, main
from frink_mlx.settings import SETTING_DOCS, Settings

FIELDS = list(setting_fields())


def test_every_field_has_exactly_one_documented_row():
    """The docs are read off the fields (settings.py `doc`): a field without one is missing."""
    assert sorted(SETTING_DOCS) == sorted(FIELDS)
    for name, doc in SETTING_DOCS.items():
        assert doc.help.strip() and doc.help != "(undocumented)", name


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_serve_help_lists_every_setting_with_its_default_and_env_var():
    proc = subprocess.run(cli("serve", "--help"), capture_output=True, text=True, env=env(),
                          cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    text = _collapse(proc.stdout)
    for name in FIELDS:
        assert flag_names(name)[0] in text, name
        assert f"[default: {_collapse(default_text(name))}; env {env_name(name)}]" in text, name


def _sample(name: str) -> tuple[list[str], object]:
    """argv for one flag and the value Settings should then hold."""
    field = setting_fields()[name]
    flag, kind = flag_names(name)[0], field.type
    if typing.get_origin(kind) is typing.Annotated:  # the bounds and the doc (settings.py)
        kind = typing.get_args(kind)[0]
    text = str(kind)
    if "bool" in text:
        default = field.default
        return ([f"--no-{flag[2:]}"], False) if default is not False else ([flag], True)
    if "tuple" in text:
        return [flag, "a.example", flag, "b.example"], ("a.example", "b.example")
    if "Literal" in text:  # one of its values (kv_bits: 4 | 8)
        choice = typing.get_args(next(a for a in typing.get_args(kind)
                                      if typing.get_origin(a) is typing.Literal))[-1]
        return [flag, str(choice)], choice
    if "int" in text:
        return [flag, "7"], 7
    if "float" in text:
        return [flag, "0.5"], 0.5
    return [flag, "/some/where"], "/some/where"


@pytest.mark.parametrize("name", FIELDS)
def test_every_flag_reaches_its_setting(name):
    argv, expected = _sample(name)
    args = build_parser().parse_args(["serve", *argv])
    overrides = {k: v for k, v in vars(args).items() if k in setting_fields()}
    settings = Settings.load(**overrides)
    assert getattr(settings, name) == expected


def test_flags_not_given_leave_env_and_defaults_alone(monkeypatch):
    monkeypatch.setenv("FRINK_MLX_BLOCK_SIZE", "8")
    args = build_parser().parse_args(["serve", "--max-batch", "3"])
    overrides = {k: v for k, v in vars(args).items() if k in setting_fields()}
    settings = Settings.load(**overrides)
    assert (settings.block_size, settings.max_batch, settings.batching) == (8, 3, True)
    assert settings == msgspec.structs.replace(Settings.load(), max_batch=3)


def test_a_bad_flag_value_is_one_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--block-size", "four"])
    assert exc.value.code == 2
    assert "argument --block-size: invalid int value: 'four'" in capsys.readouterr().err


def test_a_value_outside_a_settings_choices_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--kv-bits", "5"])
    assert exc.value.code == 2
    assert "argument --kv-bits: invalid choice: 5 (choose from 4, 8)" in capsys.readouterr().err



@pytest.mark.parametrize("argv, named", [(["--spec-draft-rows", "0"], "spec_draft_rows"),
                                         (["--spec-ngram", "1"], "spec_ngram")])
def test_a_value_out_of_its_bounds_is_one_error_naming_the_setting(capsys, argv, named):
    assert main(["serve", *argv]) == 2  # refused while loading: nothing started
    err = capsys.readouterr().err
    assert err.startswith("frink-mlx: error: invalid setting") and f"$.{named}" in err
    assert "Traceback" not in err

def test_readme_settings_section_is_generated_from_the_table():
    section = readme_section((ROOT / "README.md").read_text())
    assert section is not None, "README.md lost its settings markers"
    assert section == settings_markdown(), \
        "README's settings table is stale: run `python -m frink_mlx.cli.flags README.md`"
    for name in FIELDS:
        assert f"`{env_name(name)}`" in section and f"`{flag_names(name)[0]}`" in section
