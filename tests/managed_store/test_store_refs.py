from __future__ import annotations

import pytest

from managed_store import InvalidRef, ManagedNotFound, ManagedStore
from managed_store.layout import StoreLayout
from managed_store.refs import REF_ID_PATTERN, new_ref_id, validate_ref_id

VALID_UNKNOWN = "m_" + "0123456789abcdefghijklmnop"

HOSTILE = [
    "../../etc/passwd",
    "/etc/passwd",
    "objects/../index.sqlite",
    "m_" + "a" * 25 + "/",
    "m_" + "a" * 12 + "/" + "a" * 13,
    "m_" + "a" * 12 + "\x00" + "a" * 13,
    "m_" + "a" * 26 + "\x00",
    VALID_UNKNOWN + "\n",
    "m_" + "\u0430" * 26,  # Cyrillic a
    "m_" + "\uff11" * 26,  # fullwidth digit one
    "m_" + "\u0661" * 26,  # Arabic-Indic digit one (a \\d digit)
    "m_" + "A" * 26,
    "M_" + "a" * 26,
    "m_" + "a" * 25,
    "m_" + "a" * 27,
    "",
    "m_",
]


def test_new_ids_are_well_formed_and_distinct() -> None:
    ids = {new_ref_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(REF_ID_PATTERN.fullmatch(ref_id) for ref_id in ids)


@pytest.mark.parametrize("bad", [*HOSTILE, None, 7, b"m_" + b"a" * 26])
def test_validate_refuses(bad: object) -> None:
    with pytest.raises(InvalidRef):
        validate_ref_id(bad)


def test_invalid_ref_message_is_bounded() -> None:
    with pytest.raises(InvalidRef) as info:
        validate_ref_id("x" * 10_000)
    assert len(str(info.value)) < 200


def test_layout_never_builds_a_path_from_an_unchecked_string(tmp_path) -> None:
    layout = StoreLayout(tmp_path)
    with pytest.raises(ValueError, match="validated"):
        layout.object_path("../../etc/passwd")
    assert layout.object_path(VALID_UNKNOWN).parent == tmp_path / "objects"


@pytest.mark.anyio
@pytest.mark.parametrize("bad", HOSTILE)
async def test_every_id_taking_method_refuses_hostile_ids(store: ManagedStore, bad: str) -> None:
    with pytest.raises(InvalidRef):
        await store.read_lines(bad)
    with pytest.raises(InvalidRef):
        await store.read_bytes(bad)
    with pytest.raises(InvalidRef):
        await store.grep(bad, "x")
    with pytest.raises(InvalidRef):
        await store.stat(bad)


@pytest.mark.anyio
async def test_invalid_ref_wins_over_bad_arguments(store: ManagedStore) -> None:
    with pytest.raises(InvalidRef):
        await store.read_lines("../x", offset=0)


@pytest.mark.anyio
async def test_valid_unknown_id_is_not_found(store: ManagedStore) -> None:
    with pytest.raises(ManagedNotFound, match=VALID_UNKNOWN):
        await store.read_lines(VALID_UNKNOWN)
    with pytest.raises(ManagedNotFound, match=VALID_UNKNOWN):
        await store.read_bytes(VALID_UNKNOWN)
    with pytest.raises(ManagedNotFound, match=VALID_UNKNOWN):
        await store.grep(VALID_UNKNOWN, "x")
    with pytest.raises(ManagedNotFound, match=VALID_UNKNOWN):
        await store.stat(VALID_UNKNOWN)
