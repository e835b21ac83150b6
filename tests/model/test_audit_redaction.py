"""The `redacted` audit copy: key names normalised before matching, JSON text parsed first."""

from __future__ import annotations

import json

import pytest

from sidecar.model.audit_redaction import (
    MASK,
    MAX_PARSED,
    Redaction,
    is_secret_key,
    key_words,
    redact,
)
from sidecar.stores.call_history import AuditSettings


@pytest.mark.parametrize(("key", "words"), [
    ("X-Api-Key", ("x", "api", "key")),
    ("x_api_key", ("x", "api", "key")),
    ("xApiKey", ("x", "api", "key")),
    ("APIKey", ("api", "key")),
    ("XAPIKey", ("xapi", "key")),  # an acronym run cannot be split; joined it still matches
    ("privateKey", ("private", "key")),
    ("PRIVATE-KEY", ("private", "key")),
    ("db.pass2", ("db", "pass", "2")),
    ("\uff21\uff30\uff29\uff3f\uff2b\uff25\uff39", ("api", "key")),  # fullwidth: NFKC
    ("", ()),
])
def test_key_words_split_case_separators_humps_and_digits(key: str, words: tuple[str, ...]
                                                          ) -> None:
    assert key_words(key) == words


@pytest.mark.parametrize("key", [
    "api-key", "x-api-key", "X-Api-Key", "private-key", "privateKey", "auth", "bearer", "pwd",
    "pass", "Password", "passwd", "client_secret", "accessToken", "refresh_token", "Cookie",
    "Authorization", "AUTH_HEADER", "db_pass", "keyPass", "aws_secret_access_key", "apiKey",
    "APIKEY", "XAPIKey", "authKey", "x-auth", "jwt", "credentials", "session_key", "contraseña",
])
def test_secret_looking_keys_are_masked(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", [
    "author", "passage", "bypass", "compass", "path", "keyboard", "key", "monkey", "query",
    "pin_count", "authority_url", "description",
])
def test_ordinary_keys_are_kept(key: str) -> None:
    assert not is_secret_key(key)


def test_configured_fields_match_whatever_their_spelling() -> None:
    for key in ("customer_id", "customerId", "Customer-ID", "CUSTOMER_ID"):
        assert is_secret_key(key, ["customerId"])
    assert not is_secret_key("customer", ["customerId"])


NESTED = {"query": "q", "headers": {"X-Api-Key": "sk-nested-1", "Accept": "json"},
          "auth": {"user": "ada", "pwd": "pw-2"}, "list": [{"privateKey": "pk-3"}],
          "bearer": "b-4", "pass": "p-5", "private-key": "pk-6", "api-key": "ak-7"}
SECRETS = ("sk-nested-1", "pw-2", "pk-3", "b-4", "p-5", "pk-6", "ak-7")


def test_an_input_sent_as_json_text_is_parsed_then_redacted() -> None:
    out = redact(json.dumps(NESTED))
    assert out == {"query": "q", "headers": {"X-Api-Key": MASK, "Accept": "json"},
                   "auth": MASK, "list": [{"privateKey": MASK}], "bearer": MASK,
                   "pass": MASK, "private-key": MASK, "api-key": MASK}
    assert redact("  [" + json.dumps(NESTED) + "]") == [out]


def test_json_text_inside_a_value_is_redacted_and_stays_text() -> None:
    value = {"body": json.dumps(NESTED), "plain": '{"n": 1}', "broken": '{"password": '}
    out = redact(value)
    assert isinstance(out["body"], str) and not any(s in out["body"] for s in SECRETS)
    assert json.loads(out["body"])["headers"] == {"X-Api-Key": MASK, "Accept": "json"}
    assert out["plain"] == '{"n": 1}' and out["broken"] == '{"password": '


def test_json_text_too_long_to_parse_is_not_kept() -> None:
    long_text = '{"password": "hunter2", "pad": "' + "x" * MAX_PARSED + '"}'
    assert redact({"body": long_text}) == {
        "body": f"(JSON text of {len(long_text)} characters, not kept)"}
    assert redact(long_text) == f"(JSON text of {len(long_text)} characters, not kept)"


def test_text_that_is_not_json_is_only_cut() -> None:
    assert redact("hello") == "hello"
    assert redact("{not json") == "{not json"
    assert redact("[" * 300) == "[" * 256 + "... (300 characters)"


def test_an_unchanged_input_is_returned_as_is() -> None:
    value = {"q": "ok", "n": [1, {"m": "x"}]}
    assert Redaction().copy(value) is value


def test_the_audit_setting_keeps_the_redacted_json_text_input() -> None:
    size, kept, kept_json = AuditSettings("redacted").keep_encoded(json.dumps(NESTED))
    assert kept_json is not None and not any(s in kept_json for s in SECRETS)
    assert kept["headers"]["X-Api-Key"] == MASK and size > len(json.dumps(NESTED))
    assert AuditSettings("full").keep(json.dumps(NESTED))[1] == json.dumps(NESTED)
