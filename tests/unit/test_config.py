"""Settings precedence (flags > env > file > default) and the errors bad values produce."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from meshctl import config
from meshctl.config import GlobalSettings, resolve, setting
from meshctl.errors import ConfigError, UserError


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    port: int = setting(15001, env="SAMPLE_PORT", flag="--port")
    mode: str = setting("REDIRECT", env="SAMPLE_MODE", choices=("REDIRECT", "TPROXY"))
    ranges: tuple[str, ...] = setting((), env="SAMPLE_RANGES")
    dry_run: bool = setting(False, env="SAMPLE_DRY_RUN")


def test_defaults_apply_when_no_source_gives_a_value():
    assert resolve(Sample, env={}) == Sample()


def test_flag_beats_env_beats_file():
    file = {"port": 3}
    env = {"SAMPLE_PORT": "2"}
    assert resolve(Sample, flags={"port": 1}, env=env, file=file).port == 1
    assert resolve(Sample, flags={"port": None}, env=env, file=file).port == 2
    assert resolve(Sample, env={}, file=file).port == 3


def test_empty_env_var_counts_as_unset():
    assert resolve(Sample, env={"SAMPLE_PORT": ""}).port == 15001


def test_values_are_coerced_to_field_types():
    got = resolve(
        Sample, env={"SAMPLE_RANGES": "10.0.0.0/8, 192.168.0.0/16", "SAMPLE_DRY_RUN": "yes"}
    )
    assert got.ranges == ("10.0.0.0/8", "192.168.0.0/16")
    assert got.dry_run is True
    assert resolve(Sample, env={}, file={"dry-run": False, "ranges": ["a"]}).ranges == ("a",)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"env": {"SAMPLE_PORT": "x15"}}, "env SAMPLE_PORT: invalid value 'x15'"),
        ({"flags": {"port": "nope"}, "env": {}}, "flag --port: invalid value 'nope'"),
        ({"env": {}, "file": {"port": True}}, "config file key 'port'"),
        ({"env": {"SAMPLE_MODE": "NAT"}}, "env SAMPLE_MODE: invalid value 'NAT'"),
        ({"env": {"SAMPLE_DRY_RUN": "maybe"}}, "env SAMPLE_DRY_RUN"),
        ({"env": {}, "file": {"prot": 1}}, "unknown key(s) prot"),
    ],
)
def test_bad_values_name_their_source(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        resolve(Sample, **kwargs)
    assert needle in info.value.message
    assert info.value.exit_code == 2
    assert isinstance(info.value, UserError)


def test_choice_error_hints_the_allowed_values():
    with pytest.raises(ConfigError) as info:
        resolve(GlobalSettings, env={"MESHCTL_LOG_FORMAT": "xml"})
    assert info.value.hint == "use one of: text, json"


def test_settings_file_is_read_when_named(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("log-level: debug\nversion:\n  output: json\n")
    data, name = config.load_file(str(path), env={})
    assert data == {"log-level": "debug", "version": {"output": "json"}}
    assert name == str(path)
    assert config.section(data, "version", name) == {"output": "json"}


def test_missing_default_settings_file_is_fine(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.load_file(None, env={}) == ({}, str(tmp_path / ".config/meshctl/config.yaml"))


def test_an_inaccessible_default_settings_file_counts_as_none(tmp_path: Path, monkeypatch):
    # A home the process may not look into (a container's other uid) fails stat() with EACCES
    # as non-root; a name over NAME_MAX fails it for root too (ENAMETOOLONG), the same way.
    unreachable = tmp_path / ("x" * 300) / "config.yaml"
    with pytest.raises(OSError, match="too long"):
        unreachable.is_file()
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", unreachable)
    assert config.load_file(None, env={}) == ({}, str(unreachable))


@pytest.mark.parametrize(
    ("content", "needle"),
    [("a: [unclosed\n", "invalid YAML at line 2, column 1"), ("- a\n- b\n", "must hold a mapping")],
)
def test_broken_settings_file_is_a_config_error(tmp_path: Path, content, needle):
    path = tmp_path / "c.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        config.load_file(str(path), env={})


def test_named_settings_file_must_exist(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read settings file"):
        config.load_file(None, env={"MESHCTL_CONFIG": str(tmp_path / "absent.yaml")})


def test_file_section_reads_what_the_root_command_loaded():
    meta = {config.SETTINGS_FILE_META: ({"version": {"output": "json"}}, "/etc/m.yaml")}
    assert config.file_section(meta, "version") == (
        {"output": "json"},
        "/etc/m.yaml section 'version'",
    )
    assert config.file_section({}, "version") == ({}, "config file section 'version'")
    with pytest.raises(ConfigError, match="section 'version' must be a mapping"):
        config.file_section({config.SETTINGS_FILE_META: ({"version": 3}, "f")}, "version")
