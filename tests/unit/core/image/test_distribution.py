"""meshctl.core.image.distribution: references, WWW-Authenticate challenges, token URLs, docker
config credentials and registry error bodies as one line with a hint."""

from __future__ import annotations

import base64
import json
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.image.distribution import (
    BadReferenceError,
    Challenge,
    Credentials,
    Reference,
    config_credentials,
    helper_for,
    hint_for,
    parse_challenges,
    parse_error,
    parse_reference,
    token_from,
    token_url,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:5000/meshctl:0.1.0", Reference("127.0.0.1:5000", "meshctl", "0.1.0")),
        ("localhost/meshctl:0.1.0", Reference("localhost", "meshctl", "0.1.0")),
        (
            "registry.example/team/mesh/meshctl",
            Reference("registry.example", "team/mesh/meshctl", "latest"),
        ),
        ("meshctl:1", Reference("docker.io", "library/meshctl", "1")),
        ("someone/meshctl:1", Reference("docker.io", "someone/meshctl", "1")),
        ("[::1]:5000/m:v1", Reference("[::1]:5000", "m", "v1")),
    ],
)
def test_a_reference_names_registry_repository_and_tag_as_docker_does(text, expected):
    assert parse_reference(text) == expected


def test_docker_hub_is_reached_at_its_api_host():
    assert parse_reference("meshctl:1").api_host == "registry-1.docker.io"
    assert parse_reference("r.example:444/m:1").api_host == "r.example:444"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Registry.example/UPPER:1",
        "r.example/m@sha256:" + "0" * 64,
        "r.example/m:",
        "r.example/m:bad tag",
        " r.example/m:1",
        "r.example//m:1",
    ],
)
def test_what_is_not_a_pushable_reference_is_refused_saying_why(text):
    with pytest.raises(BadReferenceError):
        parse_reference(text)


def test_challenges_are_parsed_with_quoted_strings_and_several_per_header():
    header = (
        'Bearer realm="https://auth.example/token",service="registry.example",'
        'scope="repository:a/b:pull,push", Basic realm="say \\"hi\\""'
    )
    bearer, basic = parse_challenges(header)
    assert bearer == Challenge(
        "bearer",
        {
            "realm": "https://auth.example/token",
            "service": "registry.example",
            "scope": "repository:a/b:pull,push",
        },
    )
    assert basic.scheme == "basic"
    assert basic.params == {"realm": 'say "hi"'}


def test_a_challenge_with_unquoted_params_and_odd_spacing_is_read():
    (only,) = parse_challenges("basic   Realm = registry , charset=UTF-8")
    assert only == Challenge("basic", {"realm": "registry", "charset": "UTF-8"})


@given(st.text(max_size=200))
def test_no_header_makes_the_challenge_parser_raise(header):
    for challenge in parse_challenges(header):
        assert challenge.scheme == challenge.scheme.lower()


def test_the_token_url_asks_for_pull_and_push_besides_the_challenges_scope():
    challenge = Challenge(
        "bearer",
        {"realm": "https://auth.example/token?x=1", "service": "reg", "scope": "repository:a:pull"},
    )
    url = urlsplit(token_url(challenge, "team/meshctl"))
    query = parse_qs(url.query)
    assert (url.scheme, url.netloc, url.path) == ("https", "auth.example", "/token")
    assert query == {
        "x": ["1"],
        "service": ["reg"],
        "scope": ["repository:a:pull", "repository:team/meshctl:pull,push"],
    }
    with pytest.raises(ValueError, match="not an http"):
        token_url(Challenge("bearer", {"realm": "file:///etc/passwd"}), "a")


def test_the_token_is_taken_from_token_or_access_token():
    assert token_from(b'{"token": "t1", "expires_in": 60}') == "t1"
    assert token_from(b'{"access_token": "t2"}') == "t2"
    for bad in (b"<html>", b"{}", b'{"token": 5}', b"[]"):
        with pytest.raises(ValueError, match="token"):
            token_from(bad)


def test_credentials_come_from_the_configs_auths_under_any_spelling_of_the_host():
    encoded = base64.b64encode(b"u:p:with:colons").decode()
    config = {"auths": {"https://r.example:5000": {"auth": encoded}}}
    assert config_credentials(config, "r.example:5000") == Credentials("u", "p:with:colons")
    hub = {"auths": {"https://index.docker.io/v1/": {"username": "me", "password": "pw"}}}
    assert config_credentials(hub, "docker.io") == Credentials("me", "pw")
    assert config_credentials(hub, "r.example") is None
    assert config_credentials({}, "r.example") is None
    with pytest.raises(ValueError, match="not base64"):
        config_credentials({"auths": {"r": {"auth": "%%%"}}}, "r")


def test_a_credential_helper_is_named_when_the_config_keeps_no_password():
    config = {"credsStore": "desktop", "credHelpers": {"r.example": "ecr-login"}}
    assert helper_for(config, "r.example") == "ecr-login"
    assert helper_for(config, "other.example") == "desktop"
    assert helper_for({}, "r.example") is None


def test_credentials_never_show_their_password():
    shown = repr(Credentials("alice", "hunter2"))
    assert "hunter2" not in shown
    assert (
        Credentials("alice", "hunter2").basic()
        == "Basic " + base64.b64encode(b"alice:hunter2").decode()
    )


def test_a_registry_error_body_becomes_its_code_and_message_on_one_line():
    body = json.dumps(
        {
            "errors": [
                {
                    "code": "DENIED",
                    "message": "requested access\nto the resource is denied",
                    "detail": None,
                },
                {"code": "X"},
            ]
        }
    ).encode()
    error = parse_error(403, body)
    assert error.code == "DENIED"
    assert error.line() == "DENIED: requested access to the resource is denied (and 1 more)"
    ref = parse_reference("r.example/team/m:1")
    assert "push access" in hint_for(error, ref)


def test_a_body_that_is_not_the_specs_becomes_an_http_error_truncated():
    error = parse_error(502, b"<html>" + b"x" * 1000, "Bad Gateway")
    assert error.code == "HTTP_502"
    assert error.line().startswith("HTTP_502: Bad Gateway <html>xxx")
    assert len(error.line()) < 300
    assert parse_error(401, b"").code == "HTTP_401"
    assert "--password-stdin" in hint_for(parse_error(401, b""), parse_reference("r.example/m:1"))


@pytest.mark.parametrize(
    "code",
    [
        "UNAUTHORIZED",
        "DENIED",
        "NAME_UNKNOWN",
        "NAME_INVALID",
        "TOOMANYREQUESTS",
        "MANIFEST_INVALID",
    ],
)
def test_every_common_error_code_has_its_own_hint(code):
    ref = parse_reference("r.example/m:1")
    error = parse_error(400, json.dumps({"errors": [{"code": code, "message": "m"}]}).encode())
    assert hint_for(error, ref) != hint_for(parse_error(400, b""), ref)
