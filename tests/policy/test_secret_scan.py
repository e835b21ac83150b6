"""`sidecar.policy.secret_scan` with detect-secrets' real detectors: what is found, the span a
marker replaces, the entropy filters, the scan budget."""

from __future__ import annotations

import pytest

from sidecar.policy.secret_scan import ScanBudget, SecretScanner, redact_json, redact_text

SCANNER = SecretScanner()
PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
       "-----END OPENSSH PRIVATE KEY-----")


def redacted(text: str, scanner: SecretScanner = SCANNER) -> str:
    return redact_text(text, scanner, ScanBudget(1 << 20))


@pytest.mark.parametrize(("text", "expected"), [
    ("id AKIAIOSFODNN7EXAMPLE.", "id [redacted: AWS Access Key]."),
    ("token ghp_" + "a1B2" * 9 + " end", "token [redacted: GitHub Token] end"),
    ("xoxb-1234567890-abcdefghij", "[redacted: Slack Token]"),
    ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc" + "!", "[redacted: Stripe Access Key]!"),
    ("https://bob:hunter2pass@db.example/x",
     "https://bob:[redacted: Basic Auth Credentials]@db.example/x"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl ok",
     "jwt [redacted: JSON Web Token] ok"),
    (f"key:\n{PEM}\nafter", "key:\n[redacted: Private Key]\nafter"),
    ("cut -----BEGIN RSA PRIVATE KEY-----\nMIIEow", "[redacted: Private Key]"),
])
def test_each_kind_is_replaced_whole_by_a_marker_naming_it(text: str, expected: str) -> None:
    assert redacted(text) == expected


def test_high_entropy_strings_pass_the_filters() -> None:
    key = '"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"'
    assert redacted(f"secret = {key}") == 'secret = "[redacted: Base64 High Entropy String]"'
    assert redacted(key, SecretScanner(entropy=False)) == key
    sha = '"3f786850e387550fdab836ed7e6dc881de23001b"'  # hex: a commit id, never flagged
    uuid = '"123e4567-e89b-12d3-a456-426614174000"'
    blob = '"' + "QUJDRGVmZ2hpamtsbW5vcHFyc3R1dnd4eXo0NTY3ODk" * 8 + '"'  # data, not a key
    for text in (sha, uuid, blob, '"abcdefghijklmnopqrstuvwxyz"'):
        assert redacted(text) == text


def test_json_string_values_count_as_quoted_and_keys_are_not_scanned() -> None:
    value = {"AKIAIOSFODNN7EXAMPLE": ["wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", 3, None]}
    budget = ScanBudget(1 << 20)
    assert redact_json(value, SCANNER, budget) == {
        "AKIAIOSFODNN7EXAMPLE": ["[redacted: Base64 High Entropy String]", 3, None]}
    assert budget.kinds == ["Base64 High Entropy String"]
    clean = {"a": ["b", {"c": "d"}]}
    assert redact_json(clean, SCANNER, ScanBudget(100)) is clean


def test_text_past_the_budget_is_counted_not_scanned() -> None:
    budget = ScanBudget(30)
    text = "head AKIAIOSFODNN7EXAMPLE " + "x" * 50 + " AKIAI44QH8DHBEXAMPLE"
    out = redact_text(text, SCANNER, budget)
    assert out.startswith("head [redacted: AWS Access Key] ")
    assert out.endswith(" AKIAI44QH8DHBEXAMPLE")  # past the limit: passed unscanned
    assert budget.unscanned == len(text) - 30 and budget.remaining == 0
