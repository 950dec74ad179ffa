"""Config files: every problem as file:line:column: what is wrong: what would be right."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config_yaml import ConfigError, load
from gateway.registry import Registry, RegistryError

GOOD = """\
upstreams:
  vllm: {protocol: openai, host: 127.0.0.1, port: 8000}
  triton: {protocol: kserve_v2, host: 127.0.0.1, port: 8001}
server_default:
  kserve_v2: triton
models:
  llama:
    latest: v1
    versions:
      v1: {upstream: vllm}
"""


def test_good_registry_loads() -> None:
    assert Registry.from_yaml(GOOD, "r.yaml").spec.models["llama"].latest == "v1"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("port: 8000", "prot: 8000", "r.yaml:2:45: unknown key 'prot': did you mean 'port'?"),
        (
            "port: 8000",
            "port: eighty",
            "r.yaml:2:51: upstreams.vllm.port: Input should be a valid integer (got 'eighty'): write a whole number",
        ),
        (
            "port: 8000",
            "port: 70000",
            "r.yaml:2:51: upstreams.vllm.port: Input should be less than or equal to 65535 (got 70000): use a value in range",
        ),
        (
            "protocol: openai",
            "protocol: grpc",
            "r.yaml:2:20: upstreams.vllm.protocol: Input should be 'openai' or 'kserve_v2' (got 'grpc'): "
            "use one of: 'openai' or 'kserve_v2'",
        ),
        (
            "latest: v1",
            "latest: v9",
            "r.yaml:8:13: latest version 'v9' is not among the versions: use one of: v1",
        ),
        ("{upstream: vllm}", "{upstream: vlm}", "r.yaml:10:22: unknown upstream 'vlm': did you mean 'vllm'?"),
        (
            "kserve_v2: triton",
            "kserve_v2: vllm",
            "r.yaml:5:14: upstream 'vllm' speaks openai, not kserve_v2: name an upstream of that protocol",
        ),
        (
            "  llama:",
            "  bad name!:",
            "r.yaml:7:3: model name 'bad name!' is not allowed: use letters, digits, '.', '_' or '-'",
        ),
        ("    latest: v1\n", "", "r.yaml:8:5: missing key 'models.llama.latest': add it"),
        ("models:", "modles:", "r.yaml:6:1: unknown key 'modles': did you mean 'models'?"),
        (
            "port: 8000}",
            "port: 8000, tls: {ca_file: ca.pem, cert_file: me.pem}}",
            "r.yaml:2:62: upstream 'vllm' has only one of tls.cert_file and tls.key_file: give both for mutual TLS, or neither",
        ),
        (
            "port: 8000}",
            "port: 8000, tls: {ca_file: ca.pem, verify: false}}",
            "r.yaml:2:80: unknown key 'verify': allowed keys: ca_file, cert_file, key_file, server_name",
        ),
    ],
)
def test_broken_registry_messages(old: str, new: str, message: str) -> None:
    text = GOOD.replace(old, new, 1)
    assert text != GOOD
    with pytest.raises(RegistryError) as e:
        Registry.from_yaml(text, "r.yaml")
    assert message in [str(p) for p in e.value.problems], str(e.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\na: 2\n", "f.yaml:2:1: duplicate key 'a': each key may appear once in a mapping"),
        ("a: &x 1\nb: *x\n", "f.yaml:2:4: not valid YAML: anchors and aliases are not allowed"),
        (
            "a: !!python/object:os.system x\n",
            "f.yaml:1:4: tag 'tag:yaml.org,2002:python/object:os.system' is not allowed: "
            "use plain strings, numbers, booleans, lists and mappings",
        ),
        (
            "a: [1,\n",
            "f.yaml:2:1: not valid YAML: expected the node content, but found '<stream end>': "
            "check indentation, quotes and colons here",
        ),
        ("", "f.yaml:1:1: the file is empty: it needs at least the required sections"),
    ],
)
def test_strict_yaml(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(text, "f.yaml")
    assert [str(p) for p in e.value.problems] == [message]


def test_times_and_dates_read_as_written() -> None:
    # YAML 1.1 would make them datetime objects; a field that wants a time parses the text itself.
    data, _ = load("a: 2027-03-31T00:00:00Z\nb: 2024-06-01\nc: '2024-06-01'\n", "f.yaml")
    assert data == {"a": "2027-03-31T00:00:00Z", "b": "2024-06-01", "c": "2024-06-01"}


def test_problems_are_listed_in_file_order() -> None:
    text = GOOD.replace("port: 8000", "port: x").replace("{upstream: vllm}", "{upstream: vllm, extra: 1}")
    with pytest.raises(RegistryError) as e:
        Registry.from_yaml(text, "r.yaml")
    assert [(p.line, p.column) for p in e.value.problems] == [(2, 51), (10, 28)]


def test_key_file_problems_are_located(tmp_path: Path) -> None:
    from filters.principal import KeyFileError, KeyStore

    f = tmp_path / "keys.yaml"
    f.write_text(
        "keys:\n"
        "  - {id: a, sha256: " + "a" * 64 + ", user: u, tenant: t}\n"
        "  - {id: b, sha256: " + "a" * 64 + ", user: u, tenant: t}\n"
        "  - {id: c, sha256: ABC, user: u, tenant: t, admin: true}\n"
    )
    with pytest.raises(KeyFileError) as e:
        KeyStore.load(f)
    assert [str(p).removeprefix(str(f)) for p in e.value.problems] == [
        ":4:46: unknown key 'admin': allowed keys: disabled, expires, groups, id, sha256, tenant, user",
    ]
    f.write_text(f.read_text().replace(", admin: true", ""))
    with pytest.raises(KeyFileError) as e:
        KeyStore.load(f)
    assert [str(p).removeprefix(str(f)) for p in e.value.problems] == [
        ":3:21: key 'b' is the same key as another entry: each key may appear once",
        ":4:21: key 'c': sha256 must be 64 lower-case hex digits: paste the digest that `ztgate keys new` printed",
    ]


def test_tls_to_a_consul_service_names_the_certificate() -> None:
    doc = GOOD.replace("host: 127.0.0.1, port: 8000}", "service: vllm, tls: {ca_file: ca.pem}}")
    with pytest.raises(RegistryError) as e:
        Registry.from_yaml(doc, "consul:ztgate/registry")
    assert [str(p) for p in e.value.problems] == [
        "consul:ztgate/registry:2:48: upstream 'vllm' needs tls.server_name: "
        "name the host its certificate is for (a service has no one host)"
    ]
    fixed = Registry.from_yaml(
        doc.replace("{ca_file: ca.pem}", "{ca_file: ca.pem, server_name: vllm.internal}"), "consul:k"
    )
    assert fixed.spec.upstreams["vllm"].tls_name == "vllm.internal"
