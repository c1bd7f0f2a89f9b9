"""Injector settings given to install (components.controlplane.inject) reach the webhook as the
env its injector reads, checked by the injector's own parser before anything is rendered."""

from __future__ import annotations

import pytest

from meshctl import config
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.k8s.inject.webhook_env import INSTALL_OWNED, webhook_env
from meshctl.errors import ConfigError

SOURCE = "components.controlplane.inject"


def test_the_webhook_reads_back_exactly_the_settings_install_was_given():
    env = webhook_env(
        [
            "network=net1",
            "interception-mode=TPROXY",
            "exclude_ip_ranges=10.0.0.0/8",
            "status-port=15030",
        ],
        SOURCE,
    )
    read = config.resolve(InjectSettings, env=dict(env))
    assert (read.network, read.interception_mode) == ("net1", "TPROXY")
    assert (read.exclude_ip_ranges, read.status_port) == ("10.0.0.0/8", 15030)
    assert all(name.startswith("MESHCTL_INJECT_") for name, _ in env)


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("network", "is not NAME=VALUE"),
        ("=net1", "is not NAME=VALUE"),
        ("netwrok=net1", "unknown key(s) netwrok"),
        ("interception-mode=FOO", "key 'interception-mode': invalid value 'FOO'"),
        ("status-port=70000", "status-port"),
        ("image=registry.example/meshctl:1", "image is set by install itself"),
        ("cni=true", "cni is set by install itself"),
    ],
)
def test_a_bad_item_is_one_error_naming_the_values_key(item, says):
    with pytest.raises(ConfigError) as refused:
        webhook_env([item], SOURCE)
    assert SOURCE in refused.value.message
    assert says in refused.value.message


def test_every_setting_install_owns_is_a_real_setting():
    names = {f.replace("_", "-") for f in InjectSettings.__dataclass_fields__}
    assert names >= INSTALL_OWNED
