"""The near-miss index and the closest MIG profile: compiled once, looked up in time that does
not grow with the policy, and answering what the plain definitions answer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import webhook
from webhook.policy import mig
from webhook.policy.names import NearMisses, near_miss_key, within_one_edit

DEFAULT = webhook.load_policy(webhook.default_policy_path())
DECLARED = sorted(DEFAULT.declared_names)


def scanned_match(name: str, declared: list[str]) -> str | None:
    """The definition: scan the declared names in sorted order, by near-miss key (the last
    name of a key stands for it), for the same key, then an anagram, then one edit."""
    by_key: dict[str, str] = {}
    for candidate in sorted(declared):
        by_key[near_miss_key(candidate)] = candidate
    key = near_miss_key(name)
    if key in by_key:
        return by_key[key]
    domain, _, short = key.partition("/")
    for candidate_key, candidate in by_key.items():
        if sorted(candidate_key.partition("/")[2]) == sorted(short) and (
            candidate.split("/")[0] == name.split("/")[0]
        ):
            return candidate
    if len(short) < 2:
        return None
    for candidate_key, candidate in by_key.items():
        candidate_domain, _, candidate_short = candidate_key.partition("/")
        if candidate_domain == domain and within_one_edit(short, candidate_short):
            return candidate
    return None


# Names built from the letters of declared names, so that near misses are common.
LETTERS = sorted(set("".join(n.partition("/")[2] for n in DECLARED)) | set("-._+S"))
SHORT_NAMES = st.text(alphabet=LETTERS, min_size=0, max_size=14)
DOMAINS = st.sampled_from(["nvidia.com", "NVIDIA.com", "amd.com", "nvidia.co"])


@settings(derandomize=True, max_examples=1500, deadline=None)
@given(domain=DOMAINS, short=SHORT_NAMES)
def test_the_index_answers_what_a_scan_of_the_names_answers(domain: str, short: str) -> None:
    name = f"{domain}/{short}"
    assert DEFAULT.near_misses.match(name) == scanned_match(name, DECLARED)


@settings(derandomize=True, max_examples=800, deadline=None)
@given(
    domain=DOMAINS,
    declared=st.lists(SHORT_NAMES.filter(bool), min_size=1, max_size=8),
    edit=st.data(),
)
def test_one_edit_from_any_declared_name_is_found_first(domain, declared, edit) -> None:
    names = sorted({f"nvidia.com/{short}" for short in declared})
    index = NearMisses(set(names))
    base = edit.draw(st.sampled_from(names)).partition("/")[2]
    position = edit.draw(st.integers(0, len(base)))
    letter = edit.draw(st.sampled_from(LETTERS))
    for changed in (
        base[:position] + letter + base[position:],
        base[:position] + base[position + 1 :],
        base[:position] + letter + base[position + 1 :],
    ):
        name = f"{domain}/{changed}"
        assert index.match(name) == scanned_match(name, names), name


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("nvidia.com/gpus", "nvidia.com/gpu"),
        ("nvidia.com/sharedgpu", "nvidia.com/gpu.shared"),
        ("nvidia.com/gpuu", "nvidia.com/gpu"),
        ("nvidia.com/mig-1g10gb", "nvidia.com/mig-1g.10gb"),
        ("nvidia.com/hostdev", None),
        ("nvidia.com/g", None),
    ],
)
def test_examples(name: str, meant: str | None) -> None:
    assert DEFAULT.near_misses.match(name) == meant
    assert (near_miss_key(name) in DEFAULT.near_misses) == (
        meant is not None and near_miss_key(meant) == near_miss_key(name)
    )


A30 = frozenset({"1g.6gb", "1g.6gb+me", "2g.12gb", "4g.24gb"})
A100_80 = frozenset({"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"})


@pytest.mark.parametrize(
    ("profiles", "asked", "closest"),
    [
        (A100_80, "1g.5gb", "1g.10gb"),  # the least memory at least as much as asked for
        (A100_80, "1g.15gb", "1g.20gb"),
        (A100_80, "1g.40gb", "1g.20gb"),  # else the most there is
        (A30, "1g.10gb", "1g.6gb"),
        (A100_80, "5g.40gb", "7g.80gb"),  # the fewest slices at least as many as asked for
        (A100_80, "6g.60gb", "7g.80gb"),
        (A30, "7g.80gb", "4g.24gb"),  # else the most there are
        (A100_80, "2g.20gb.me", "2g.20gb"),
        (frozenset(), "1g.10gb", None),
    ],
)
def test_the_closest_profile(profiles: frozenset, asked: str, closest: str | None) -> None:
    assert mig.closest_profile(asked, mig.plain_sizes(profiles)) == closest


def test_profiles_with_attributes_are_never_suggested() -> None:
    sizes = mig.plain_sizes(frozenset({"1g.10gb.me", "1g.20gb", "2g.20gb.gfx"}))
    assert [profile for _, _, profile in sizes] == ["1g.20gb"]


def test_a_name_longer_than_any_declared_one_is_no_near_miss_and_costs_no_search() -> None:
    """Dropping each letter of a 60,000-letter name in turn makes 60,000 copies of it: a
    second and more, for one resource name of one Pod."""
    longest = max(len(near_miss_key(n).partition("/")[2]) for n in DECLARED)
    assert DEFAULT.near_misses.match("nvidia.com/" + "g" * (longest + 2)) is None
    assert DEFAULT.near_misses.match("nvidia.com/" + "a" * 60_000) is None
    one_more = next(n for n in DECLARED if len(near_miss_key(n).partition("/")[2]) == longest)
    assert DEFAULT.near_misses.match(one_more + "x") == one_more
