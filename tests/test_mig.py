"""The MIG catalogue's reading of GPU feature discovery's product labels
(``webhook.policy.mig``): real ``nvidia.com/gpu.product`` values, each with the catalogued
product it names (None: a product the catalogue does not know, or one that cannot be
partitioned)."""

from __future__ import annotations

import pytest

from webhook.policy.mig import CATALOGUE, GpuProduct, catalogue_with, catalogued_as, gfd_product

# (nvidia.com/gpu.product, nvidia.com/gpu.memory in MiB or None, the catalogued product). The
# labels are the driver's product names with spaces as "-" (k8s-device-plugin
# internal/lm/resource.go); the memory figures are what the driver reports.
LABELS = [
    ("NVIDIA-A100-SXM4-40GB", 40960, "A100-40GB"),
    ("NVIDIA-A100-PCIE-40GB", 40960, "A100-40GB"),
    ("A100-SXM4-40GB", None, "A100-40GB"),  # drivers before R470: no "NVIDIA"
    ("NVIDIA-A100-SXM4-80GB", 81920, "A100-80GB"),
    ("NVIDIA-A100-80GB-PCIe", 81920, "A100-80GB"),
    ("NVIDIA-A30", 24576, "A30"),
    ("NVIDIA-H100-80GB-HBM3", 81559, "H100-80GB"),
    ("NVIDIA-H100-PCIe", 81559, "H100-80GB"),
    ("NVIDIA-H100-NVL", 95830, "H100-94GB"),
    ("NVIDIA-H20", 97871, "H20"),
    ("NVIDIA-H200", 143771, "H200-141GB"),
    ("NVIDIA-H200-NVL", 143771, "H200-141GB"),
    ("NVIDIA-GH200-480GB", 97871, "GH200-96GB"),  # 480 GB counts the Grace CPU's memory
    ("NVIDIA-GH200-144G-HBM3e", 146831, "GH200-144GB"),
    ("NVIDIA-B200", 183359, "B200"),
    # The single strategy's -MIG-INVALID sets the memory label to 0: the name decides.
    ("NVIDIA-H100-NVL", 0, "H100-94GB"),
    ("NVIDIA-H100-PCIe", 0, "H100-80GB"),
    ("NVIDIA-GH200-480GB", None, "GH200-96GB"),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", 97887, "RTX-PRO-6000"),
    # Not partitionable, or not catalogued.
    ("NVIDIA-L4", 23034, None),
    ("Tesla-T4", 15360, None),
    ("NVIDIA-L40S", 46068, None),
    ("NVIDIA-GB200", 189471, None),  # not B200
    ("NVIDIA-A800-SXM4-80GB", 81920, None),
    ("NVIDIA-H800", 81559, None),
]


@pytest.mark.parametrize(("label", "memory", "expected"), LABELS)
def test_a_product_label_names_its_catalogued_product(
    label: str, memory: int | None, expected: str | None
) -> None:
    assert catalogued_as(gfd_product(label), memory, CATALOGUE) == expected
    # Time-sliced: GPU feature discovery appends -SHARED; the product is the same.
    assert catalogued_as(gfd_product(label + "-SHARED"), memory, CATALOGUE) == expected


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", GpuProduct("NVIDIA-A100-SXM4-40GB", "1g.5gb")),
        ("NVIDIA-A100-80GB-PCIe-MIG-1g.10gb", GpuProduct("NVIDIA-A100-80GB-PCIe", "1g.10gb")),
        ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", GpuProduct("NVIDIA-H100-80GB-HBM3", "3g.40gb")),
        ("NVIDIA-H100-NVL-MIG-1g.12gb-SHARED", GpuProduct("NVIDIA-H100-NVL", "1g.12gb")),
        ("NVIDIA-A30-MIG-1g.6gb.me", GpuProduct("NVIDIA-A30", "1g.6gb.me")),
        (
            "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition-MIG-1g.24gb-me",
            GpuProduct("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "1g.24gb-me"),
        ),
        # Single strategy with GPUs partitioned unalike.
        ("NVIDIA-A100-SXM4-40GB-MIG-INVALID", GpuProduct("NVIDIA-A100-SXM4-40GB", None)),
        ("NVIDIA-L4-SHARED", GpuProduct("NVIDIA-L4", None)),
    ],
)
def test_the_single_strategy_suffix_names_a_profile(label: str, expected: GpuProduct) -> None:
    assert gfd_product(label) == expected


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        # The single strategy's memory label is one instance's: the profile decides.
        ("NVIDIA-H100-NVL-MIG-1g.12gb", "H100-94GB"),
        ("NVIDIA-H100-PCIe-MIG-1g.10gb", "H100-80GB"),
        ("NVIDIA-GH200-480GB-MIG-1g.12gb", "GH200-96GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"),
        # The name decides (an H100 PCIe has 80 GB), and 1g.5gb is then no profile of it.
        ("NVIDIA-H100-PCIe-MIG-1g.5gb", "H100-80GB"),
        # Neither H100 offers it, and nothing else tells them apart.
        ("NVIDIA-H100-SXM5-MIG-1g.5gb", None),
    ],
)
def test_with_the_single_strategy_the_profile_tells_memory_variants_apart(
    label: str, expected: str | None
) -> None:
    assert catalogued_as(gfd_product(label), 9984, CATALOGUE) == expected


def test_a_policy_product_named_as_labelled_comes_first() -> None:
    catalogue = catalogue_with(
        [
            {"name": "NVIDIA-A800-SXM4-80GB", "profiles": ["1g.10gb", "7g.80gb"]},
            {"name": "h800", "profiles": ["1g.10gb"]},
        ]
    )
    assert catalogued_as(gfd_product("NVIDIA-A800-SXM4-80GB"), None, catalogue) == (
        "NVIDIA-A800-SXM4-80GB"
    )
    assert catalogued_as(gfd_product("NVIDIA-H800-MIG-1g.10gb"), None, catalogue) == "h800"
    # A built-in product the policy redeclares keeps its name.
    redeclared = catalogue_with([{"name": "A100-80GB", "profiles": ["7g.79gb"]}])
    assert catalogued_as(gfd_product("NVIDIA-A100-SXM4-80GB"), None, redeclared) == "A100-80GB"


def test_a_memory_variant_the_catalogue_lacks_is_not_guessed() -> None:
    only_40 = {"A100-40GB": CATALOGUE["A100-40GB"]}
    assert catalogued_as(gfd_product("NVIDIA-A100-SXM4-40GB"), None, only_40) == "A100-40GB"
    assert catalogued_as(gfd_product("NVIDIA-A100-SXM4-80GB"), 81920, only_40) is None
