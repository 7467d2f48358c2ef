"""The MIG catalogue: which MIG profiles each GPU product offers, and the profile grammar.

The device plugin's mixed strategy advertises each MIG profile as ``nvidia.com/mig-<profile>``,
replacing the ``+`` of media-extension profiles with ``.`` (``1g.10gb+me`` becomes
``mig-1g.10gb.me``), and a time-sliced MIG instance gets a ``.shared`` suffix. A profile
is ``<g>g.<mem>gb``, optionally followed by an attribute (``.me``, ``.me.all``, ``.gfx``,
``-me``) and then ``.shared``.

Sources: NVIDIA's MIG user guide (supported profiles), the gpu-operator's
``default-mig-parted-config`` and mig-parted's hopper/blackwell examples. The number beside
a profile is the most instances of it one GPU can hold. Profile memory is rounded from what
the driver reports and can differ on some boards (a 7g.79gb A100 80GB exists), so policies
can add products of their own.

GPU feature discovery names a node's product in ``nvidia.com/gpu.product``: the driver's
product name with spaces as ``-`` (``NVIDIA A100 80GB PCIe`` is ``NVIDIA-A100-80GB-PCIe``; drivers
before R470 leave ``NVIDIA`` out: ``A100-SXM4-40GB``), then with the MIG ``single`` strategy
``-MIG-<profile>`` (``NVIDIA-H100-80GB-HBM3-MIG-1g.10gb``; ``-MIG-INVALID`` when the GPUs are
not partitioned alike), then ``-SHARED`` when time-slicing replicates the resource without
renaming it. Sources: NVIDIA/k8s-device-plugin ``internal/lm/resource.go`` (``productLabel``),
``internal/lm/mig-strategy.go`` and ``docs/gfd_labels.md``; the GPU Operator's MIG guide. The
catalogue names products by model and memory, which :func:`catalogued_as` maps them to.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

MIG_PROFILE = re.compile(
    r"(?P<gpc>[1-9][0-9]?)g\.(?P<mem>[1-9][0-9]{0,3})gb"
    r"(?P<attr>\.me\.all|\.me|\.gfx|-me)?(?P<shared>\.shared)?\Z"
)
# What a MIG resource name starts with once the vendor domain is stripped.
MIG_PREFIX = "mig-"


def _table(pairs: list[tuple[str, int]]) -> MappingProxyType[str, Any]:
    return MappingProxyType(dict(pairs))


def _seven_slices(small: int, double: int, half: int, full: int) -> MappingProxyType[str, Any]:
    """The profiles of a GPU with 7 compute slices (A100, H100, H200, B200 and kin): they differ
    only in memory. ``small`` is one slice's memory, ``double`` the 1g/2g profile with twice
    that, ``half`` the 3g/4g profiles', ``full`` the whole GPU's (GB)."""
    return _table(
        [
            (f"1g.{small}gb", 7),
            (f"1g.{small}gb.me", 1),
            (f"1g.{double}gb", 4),
            (f"2g.{double}gb", 3),
            (f"3g.{half}gb", 2),
            (f"4g.{half}gb", 1),
            (f"7g.{full}gb", 1),
        ]
    )


CATALOGUE: MappingProxyType[str, Any] = MappingProxyType(
    {
        "A100-40GB": _seven_slices(5, 10, 20, 40),
        "A100-80GB": _seven_slices(10, 20, 40, 80),
        "A30": _table(
            [("1g.6gb", 4), ("1g.6gb.me", 1), ("2g.12gb", 2), ("2g.12gb.me", 1), ("4g.24gb", 1)]
        ),
        "H100-80GB": _seven_slices(10, 20, 40, 80),
        "H100-94GB": _seven_slices(12, 24, 47, 94),
        # GH200 with the 96 GB H100 (device 0x2342); H20 (0x2329) shares its profiles.
        "GH200-96GB": _seven_slices(12, 24, 48, 96),
        "H20": _seven_slices(12, 24, 48, 96),
        "GH200-144GB": _seven_slices(18, 36, 72, 144),
        "H200-141GB": _seven_slices(18, 35, 71, 141),
        "B200": _seven_slices(23, 45, 90, 180),
        "RTX-PRO-6000": _table(
            [
                ("1g.24gb", 4),
                ("1g.24gb.me", 1),
                ("1g.24gb.gfx", 4),
                ("1g.24gb.me.all", 1),
                ("1g.24gb-me", 4),
                ("2g.48gb", 2),
                ("2g.48gb.gfx", 2),
                ("2g.48gb.me.all", 1),
                ("2g.48gb-me", 2),
                ("4g.96gb", 1),
                ("4g.96gb.gfx", 1),
            ]
        ),
    }
)


def is_well_formed(profile: str) -> bool:
    """``1g.10gb``, ``1g.10gb.me``, ``3g.40gb.shared`` are; ``1g10gb``, ``1G.10GB`` are not."""
    return MIG_PROFILE.match(profile) is not None


def base_profile(profile: str) -> str:
    """The profile without ``.shared``: the instance that a time-sliced MIG replica lives on."""
    return profile[: -len(".shared")] if profile.endswith(".shared") else profile


def plain_sizes(profiles: frozenset[str]) -> tuple[tuple[int, int, str], ...]:
    """The profiles without an attribute as (compute slices, memory GB, profile), smallest
    first: what :func:`closest_profile` reads, sorted once when the policy is compiled."""
    sizes = []
    for profile in profiles:
        match = MIG_PROFILE.match(profile)
        if match and not match["attr"] and not match["shared"]:
            sizes.append((int(match["gpc"]), int(match["mem"]), profile))
    return tuple(sorted(sizes))


def closest_profile(profile: str, sizes: tuple[tuple[int, int, str], ...]) -> str | None:
    """The catalogued profile a well-formed ``profile`` most likely meant: the fewest compute
    slices at least as many as asked for (else the most there are), and of those the least
    memory at least as much as asked for (else the most): ``1g.5gb`` on an 80 GB card is
    ``1g.10gb``. Arithmetic, not string similarity: a review can name thousands."""
    wanted = MIG_PROFILE.match(profile)
    if wanted is None or not sizes:
        return None
    compute, memory = int(wanted["gpc"]), int(wanted["mem"])
    chosen = next((size[0] for size in sizes if size[0] >= compute), sizes[-1][0])
    same_compute = [size for size in sizes if size[0] == chosen]
    return next((size[2] for size in same_compute if size[1] >= memory), same_compute[-1][2])


def catalogue_with(custom_products: list[dict[str, Any]]) -> dict[str, MappingProxyType[str, Any]]:
    """The catalogue plus a policy's ``customProducts`` (one instance of each profile each)."""
    catalogue = dict(CATALOGUE)
    for product in custom_products:
        catalogue[product["name"]] = MappingProxyType({p: 1 for p in product["profiles"]})
    return catalogue


def catalogued_profiles(catalogue: dict[str, Any], products: list[str]) -> dict[str, int]:
    """Every profile of the chosen products (``*``: all), with the most instances one GPU holds."""
    chosen = list(catalogue) if "*" in products else [p for p in products if p in catalogue]
    profiles: dict[str, int] = {}
    for product in chosen:
        for profile, count in catalogue[product].items():
            profiles[profile] = max(count, profiles.get(profile, 0))
    return profiles


# GPU feature discovery's product label, and its suffixes (see the module's docstring).
GPU_PRODUCT = "nvidia.com/gpu.product"
SHARED_SUFFIX = "-SHARED"
_MIG_SUFFIX = re.compile(r"-MIG-(?P<profile>.+)\Z")  # a profile may hold "-" (1g.24gb-me)
# What the driver puts before the model in a product name.
_MAKERS = ("NVIDIA-", "TESLA-")
# The catalogued products of each model, by the memory the catalogue names them with (GB). A
# model is the product name's first word after the maker (three words for the RTX PRO 6000).
_MODELS: Mapping[str, Mapping[int, str]] = MappingProxyType(
    {
        "A100": {40: "A100-40GB", 80: "A100-80GB"},
        "A30": {24: "A30"},
        "H100": {80: "H100-80GB", 94: "H100-94GB"},
        "GH200": {96: "GH200-96GB", 144: "GH200-144GB"},
        "H20": {96: "H20"},
        "H200": {141: "H200-141GB"},
        "B200": {180: "B200"},
        "RTX-PRO-6000": {96: "RTX-PRO-6000"},
    }
)
# A memory size written in a product name: 80GB (A100-SXM4-80GB), 144G (GH200 144G HBM3e).
_MEMORY_WORD = re.compile(r"(?P<gb>[0-9]+)GB?\Z")
# Words of a product name that tell its memory variant without saying it: the H100 NVL has
# 94 GB, the H100 PCIe 80 GB, the GH200 480GB (with its Grace CPU's memory) 96 GB.
_VARIANT_WORDS: Mapping[tuple[str, str], int] = MappingProxyType(
    {("H100", "NVL"): 94, ("H100", "PCIE"): 80, ("GH200", "480GB"): 96}
)


class GpuProduct(NamedTuple):
    """A node's ``nvidia.com/gpu.product`` without GPU feature discovery's suffixes."""

    name: str  # as the label spells it: NVIDIA-A100-SXM4-40GB
    mig_profile: str | None  # the MIG single strategy's profile (never "INVALID")


def gfd_product(label: str) -> GpuProduct:
    """``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED`` is ``NVIDIA-A100-SXM4-40GB`` with ``1g.5gb``."""
    name = label[: -len(SHARED_SUFFIX)] if label.endswith(SHARED_SUFFIX) else label
    suffix = _MIG_SUFFIX.search(name)
    if suffix is None:
        return GpuProduct(name, None)
    profile = suffix["profile"]
    return GpuProduct(name[: suffix.start()], profile if is_well_formed(profile) else None)


def catalogued_as(
    product: GpuProduct, memory_mib: int | None, catalogue: Mapping[str, Collection[str]]
) -> str | None:
    """The catalogue's name for a product GPU feature discovery labelled, None when it has none.

    A policy's own product (``migCatalogue.customProducts``) named as the label names it, with
    or without the maker, comes first. Otherwise the model picks the catalogued products, and
    of several (memory variants) the one that the name's memory word (``80GB``), else the
    GPU's memory (``nvidia.com/gpu.memory``, MiB: not the MIG single strategy's, which is one
    instance's, nor the 0 of its ``-MIG-INVALID``), else a word of the name that implies it
    (``NVL``), else the single strategy's profile names."""
    name = product.name.upper()
    bare = next((name[len(m) :] for m in _MAKERS if name.startswith(m)), name)
    for known in catalogue:
        if known.upper() in (name, bare):
            return known
    words = bare.split("-")
    model = "-".join(words[:3]) if words[:2] == ["RTX", "PRO"] else words[0]
    entry = _variant(model, words[1:], product, memory_mib, catalogue)
    return entry if entry in catalogue else None


def _variant(
    model: str,
    words: list[str],
    product: GpuProduct,
    memory_mib: int | None,
    catalogue: Mapping[str, Collection[str]],
) -> str | None:
    """Of a model's catalogued products (by memory), the one the product is (see
    :func:`catalogued_as`)."""
    variants = _MODELS.get(model, {})
    if len(variants) <= 1:
        return next(iter(variants.values()), None)
    for word in words:
        written = _MEMORY_WORD.match(word)
        if written and int(written["gb"]) in variants:
            return variants[int(written["gb"])]
    if memory_mib and product.mig_profile is None:
        # The driver reports a little less than the marketed size (81,559 MiB on an H100 80GB).
        return variants[min(variants, key=lambda gb: abs(gb * 1024 - memory_mib))]
    for word in words:
        if _VARIANT_WORDS.get((model, word)) in variants:
            return variants[_VARIANT_WORDS[(model, word)]]
    offering = [
        entry
        for entry in variants.values()
        if entry in catalogue and product.mig_profile in catalogue[entry]
    ]
    return offering[0] if len(offering) == 1 else None


# What a label value may hold (Kubernetes' syntax): the single strategy's forms of profiles
# with other characters (``1g.10gb+me``) never appear in the product label.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")


def product_label_values(product: str, catalogue: Mapping[str, Collection[str]]) -> tuple[str, ...]:
    """Every value GPU feature discovery's product label takes on nodes of ``product`` (as it
    labels it: ``NVIDIA-H100-80GB-HBM3``): the product itself, with the MIG single strategy
    ``-MIG-<profile>`` for each profile the catalogue lists for it, and each of those shared
    (``-SHARED``). Sorted; only the product and its shared form for a product the catalogue
    does not know (its single-strategy forms cannot be told)."""
    entry = catalogued_as(GpuProduct(product, None), None, catalogue)
    profiles = sorted(catalogue[entry]) if entry is not None else []
    forms = [product, *(f"{product}-MIG-{profile}" for profile in profiles)]
    return tuple(
        sorted(
            value
            for form in forms
            for value in (form, form + SHARED_SUFFIX)
            if _LABEL_VALUE.match(value)
        )
    )
