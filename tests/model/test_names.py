import re

from hypothesis import given
from hypothesis import strategies as st

from sidecar.model.names import MAX_NAME_LENGTH, effective_name, is_valid_name

VALID = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
keys = st.text(min_size=1, max_size=200)
namespaces = st.one_of(st.none(), st.just(""), st.text(max_size=100))


@given(keys, namespaces)
def test_effective_name_is_always_provider_safe(key, namespace):
    name = effective_name(key, namespace)
    assert VALID.fullmatch(name), name
    assert len(name) <= MAX_NAME_LENGTH


@given(keys, namespaces)
def test_effective_name_is_deterministic(key, namespace):
    assert effective_name(key, namespace) == effective_name(key, namespace)


@given(st.from_regex(VALID, fullmatch=True))
def test_a_valid_name_without_namespace_is_unchanged(key):
    assert effective_name(key) == key
    assert effective_name(key, "") == key


def test_names_start_with_a_letter_or_underscore():
    assert effective_name("3d_render") == "_3d_render"
    assert effective_name("-x") == "_-x"
    assert effective_name("tool", "2fa") == "_2fa_tool"


def test_namespace_flattening():
    assert effective_name("status", "git") == "git_status"
    assert effective_name("read", "fs.local") == "fs_local_read"
    assert effective_name("get/user", None) == "get_user"
    assert effective_name("a b", "x") == "x_a_b"


def test_long_names_are_shortened_with_a_stable_hash_suffix():
    a = effective_name("x" * 80 + "_alpha", "server")
    b = effective_name("x" * 80 + "_beta", "server")
    assert len(a) == len(b) == MAX_NAME_LENGTH
    assert a != b
    assert a[:55] == b[:55]
    assert re.fullmatch(r"_[0-9a-f]{8}", a[55:])
    assert a == effective_name("x" * 80 + "_alpha", "server")


@given(st.text(alphabet="日本語中文한국어ру", min_size=1, max_size=10),
       st.text(alphabet="日本語中文한국어ру", min_size=1, max_size=10))
def test_names_written_only_in_non_latin_script_stay_distinct(a, b):
    if a != b:
        assert effective_name(a) != effective_name(b)


def test_is_valid_name():
    assert is_valid_name("git_status-2")
    assert not is_valid_name("")
    assert not is_valid_name("a.b")
    assert not is_valid_name("x" * 65)


def test_a_key_that_already_starts_with_the_namespace_is_not_prefixed_again():
    assert effective_name("git_status", "git") == "git_status"
    assert effective_name("git-log", "git") == "git-log"
    assert effective_name("git.diff", "git") == "git_diff"  # sanitized first, then compared
    assert effective_name("git", "git") == "git_git"  # nothing after the prefix: prefixed
    assert effective_name("gitstatus", "git") == "git_gitstatus"  # not `git_` + something
    assert effective_name("Git_status", "git") == "git_Git_status"  # case-sensitive


def test_dropping_the_prefix_never_takes_a_name_another_key_gets_by_the_plain_rule():
    from sidecar.model.names import plain_names
    from sidecar.model.tool import Tool
    from sidecar.registry.registry import build_entries

    plain = plain_names([("status", "git"), ("git_status", "git")])
    assert plain == {"git_status"}
    assert effective_name("git_status", "git", plain=plain) == "git_git_status"

    def tool() -> Tool:
        return Tool(description="d", input={"type": "object"}, execute=lambda i, c: "x")

    for order in (["status", "git_status"], ["git_status", "status"]):  # either order
        entries = build_entries({key: tool() for key in order}, "git")
        assert {entry.key: name for name, entry in entries.items()} == {
            "status": "git_status", "git_status": "git_git_status"}
