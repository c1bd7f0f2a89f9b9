"""The stdlib API reader (the CNI agent's) signs in with a kubeconfig's embedded client
certificate, loaded from memory, against the real kube-apiserver."""

from __future__ import annotations

import pytest

from meshctl.errors import ConfigError
from meshctl.kube import rest


def test_a_client_certificate_kubeconfig_reads_from_the_real_api_server(kube_cluster, tmp_path):
    config = rest.load(str(kube_cluster.kubeconfig))
    assert config.client_cert_pem, "the admin kubeconfig embeds a client certificate"
    assert config.client_key_pem
    found = rest.get_json(config, rest.namespace_path("default"), timeout=10)
    assert found["metadata"]["name"] == "default"


def test_a_kubeconfig_whose_key_does_not_load_is_named_as_the_fault(kube_cluster, tmp_path):
    import yaml

    data = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    data["users"][0]["user"]["client-key-data"] = "bm90IGEga2V5"  # "not a key"
    broken = tmp_path / "kubeconfig"
    broken.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        rest.load(str(broken))
    assert f"kubeconfig {broken}: the client certificate and key do not load" in str(caught.value)
    assert "unencrypted" in (caught.value.hint or "")
