"""Judging NVIDIA's opaque DRA parameters (``webhook.core.dra_parameters``): the driver's own
validation cases, the issue's examples with their paths and hints, the rest of what the
driver's Normalize, Validate and NodePrepareResources refuse, and the corpus' real configs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
import yaml

from tests.support.paths import SHARED
from webhook.core.dra_parameters import ParameterProblem, check_parameters, sharing_strategy
from webhook.policy.dra import near_miss
from webhook.policy.nvidia_dra import FEATURE_GATES, GPU_DRIVER, PARAMETERS_API_VERSION

API = PARAMETERS_API_VERSION
PATH = "spec.devices.config[0].opaque.parameters"
DEFAULTS = dict(FEATURE_GATES)
SHARING_ON = {**FEATURE_GATES, "TimeSlicingSettings": True, "MPSSupport": True}
DRA_CORPUS = SHARED / "conformance" / "dra"


def gpu_config(**sharing: object) -> dict[str, object]:
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}


def time_slicing(interval: str) -> dict[str, object]:
    return gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": interval})


def mps(percentage: int) -> dict[str, object]:
    return gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": percentage})


# The table of TestResourceClaimValidatingWebhook in cmd/webhook/main_test.go of
# kubernetes-sigs/dra-driver-nvidia-gpu at 95932046683719c43b6a0dd9613c2e5aad5d6703, as data:
# (case name, the case's featureGates, the spec path of the claim or template, its GpuConfigs,
# and per config the message the driver's webhook gives it, None when it accepts it). The Go
# test sets gates on a process-wide registry without resetting them, so a case also sees the
# gates earlier cases set; no outcome depends on that, and here each case has the binary's
# defaults plus its own. Its two cases without a claim (a bad content type, an empty review)
# test HTTP handling and have no parameters.
INTERVAL = "unknown time-slice interval: Invalid Interval, supported time-slice intervals: " + (
    "Default, Short, Medium, Long"
)
NEGATIVE = "active thread percentage must not be negative"
TS_GATE = (
    '"TimeSlicing" is selected as the GPU sharing strategy, but the "TimeSlicingSettings" '
    "feature gate is not enabled"
)
MPS_GATE = (
    '"MPS" is selected as the GPU sharing strategy, but the "MPSSupport" feature gate is not '
    "enabled"
)
TS = {"TimeSlicingSettings": True}
BOTH = {"TimeSlicingSettings": True, "MPSSupport": True}
MPS_ON = {"MPSSupport": True}
DRIVER_CASES = [
    ("valid GpuConfig in ResourceClaim", TS, "spec", [(time_slicing("Default"), None)]),
    (
        "invalid GpuConfigs in ResourceClaim",
        BOTH,
        "spec",
        [(time_slicing("Invalid Interval"), INTERVAL), (mps(-1), NEGATIVE)],
    ),
    (
        "valid GpuConfig in ResourceClaimTemplate",
        TS,
        "spec.spec",
        [(time_slicing("Default"), None)],
    ),
    (
        "invalid GpuConfigs in ResourceClaimTemplate",
        BOTH,
        "spec.spec",
        [(time_slicing("Invalid Interval"), INTERVAL), (mps(-1), NEGATIVE)],
    ),
    ("valid GpuConfig in ResourceClaim v1", TS, "spec", [(time_slicing("Default"), None)]),
    (
        "valid GpuConfig in ResourceClaimTemplate v1",
        TS,
        "spec.spec",
        [(time_slicing("Default"), None)],
    ),
    (
        "invalid GpuConfig in ResourceClaim v1 (tests conversion)",
        TS,
        "spec",
        [(time_slicing("Invalid Interval"), INTERVAL)],
    ),
    (
        "invalid GpuConfig in ResourceClaimTemplate v1 (tests conversion)",
        MPS_ON,
        "spec.spec",
        [(mps(-1), NEGATIVE)],
    ),
    ("valid GpuConfig in ResourceClaim v1beta2", TS, "spec", [(time_slicing("Default"), None)]),
    (
        "valid GpuConfig in ResourceClaimTemplate v1beta2",
        TS,
        "spec.spec",
        [(time_slicing("Default"), None)],
    ),
    (
        "invalid GpuConfig in ResourceClaim v1beta2 (tests conversion)",
        MPS_ON,
        "spec",
        [(mps(-1), NEGATIVE)],
    ),
    (
        "invalid GpuConfig in ResourceClaimTemplate v1beta2 (tests conversion)",
        TS,
        "spec.spec",
        [(time_slicing("Invalid Interval"), INTERVAL)],
    ),
    (
        "TimeSlicingStrategy rejected when TimeSlicingSettings feature gate is disabled",
        {"TimeSlicingSettings": False},
        "spec",
        [(time_slicing("Default"), TS_GATE)],
    ),
    (
        "MpsStrategy rejected when MPSSupport feature gate is disabled",
        {"MPSSupport": False},
        "spec",
        [(mps(50), MPS_GATE)],
    ),
    (
        "TimeSlicingStrategy rejected in ResourceClaimTemplate when TimeSlicingSettings feature "
        "gate is disabled",
        {"TimeSlicingSettings": False},
        "spec.spec",
        [(time_slicing("Default"), TS_GATE)],
    ),
    (
        "MpsStrategy rejected in ResourceClaimTemplate when MPSSupport feature gate is disabled",
        {"MPSSupport": False},
        "spec.spec",
        [(mps(50), MPS_GATE)],
    ),
]


@pytest.mark.parametrize(
    ("gates", "spec", "configs"),
    [case[1:] for case in DRIVER_CASES],
    ids=[case[0] for case in DRIVER_CASES],
)
def test_the_drivers_own_webhook_cases_get_its_verdict_and_message(
    gates: Mapping[str, bool], spec: str, configs: list[tuple[dict[str, object], str | None]]
) -> None:
    for index, (parameters, driver_message) in enumerate(configs):
        path = f"{spec}.devices.config[{index}].opaque.parameters"
        problems = check_parameters(parameters, path, gates={**DEFAULTS, **gates})
        if driver_message is None:
            assert problems == []
        else:
            assert [p.message for p in problems if p.refused] == [driver_message]
            assert all(p.path.startswith(path + ".") for p in problems)


def test_the_driver_table_is_whole() -> None:
    # 18 cases in main_test.go, 2 of them about HTTP; 18 GpuConfigs in the other 16.
    assert len(DRIVER_CASES) == 16
    assert sum(len(case[3]) for case in DRIVER_CASES) == 18


def test_a_vfio_config_is_accepted_though_the_drivers_webhook_refuses_it() -> None:
    # Divergence: cmd/webhook/main.go's type switch lists GpuConfig, MigDeviceConfig and the
    # two ComputeDomain configs but not VfioDeviceConfig, so that webhook refuses it ("expected
    # a recognized configuration type"); the kubelet plugin decodes, normalizes, validates and
    # applies it to vfio devices (cmd/gpu-kubelet-plugin/device_state.go). The kubelet plugin
    # is what runs the claim, so it is accepted here. The quickstart's parameters:
    parameters = {
        "apiVersion": API,
        "kind": "VfioDeviceConfig",
        "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": True},
    }
    assert (
        check_parameters(parameters, PATH, gates=DEFAULTS, device_types=frozenset({"vfio"})) == []
    )


def refused(path: str, value: object, message: str, hint: str) -> ParameterProblem:
    return ParameterProblem(PATH + path, value, message, hint, True)


# The examples: each with every problem it has, exactly.
def test_mps_with_a_time_slicing_config_is_refused() -> None:
    parameters = gpu_config(strategy="MPS", timeSlicingConfig={"interval": "Long"})
    assert check_parameters(parameters, PATH, gates=SHARING_ON) == [
        refused(
            ".sharing.timeSlicingConfig",
            {"interval": "Long"},
            "cannot use TimeSlicingConfig with the 'MPS' strategy",
            "remove timeSlicingConfig, or use strategy TimeSlicing",
        )
    ]


def test_time_slicing_with_an_mps_config_is_refused() -> None:
    parameters = gpu_config(strategy="TimeSlicing", mpsConfig={})
    assert check_parameters(parameters, PATH, gates=SHARING_ON) == [
        refused(
            ".sharing.mpsConfig",
            {},
            "cannot use MpsConfig with the 'TimeSlicing' strategy",
            "remove mpsConfig, or use strategy MPS",
        )
    ]


def test_an_active_thread_percentage_of_150_is_refused() -> None:
    assert check_parameters(mps(150), PATH, gates=SHARING_ON) == [
        refused(
            ".sharing.mpsConfig.defaultActiveThreadPercentage",
            150,
            "active thread percentage must not be greater than 100",
            "write a percentage from 0 to 100",
        )
    ]


def test_a_strategy_spelt_timeslicing_is_refused_with_the_spelling_meant() -> None:
    assert check_parameters(gpu_config(strategy="Timeslicing"), PATH, gates=SHARING_ON) == [
        refused(
            ".sharing.strategy",
            "Timeslicing",
            "unknown GPU sharing strategy: Timeslicing, supported GPU sharing strategies: "
            "TimeSlicing, MPS",
            "did you mean TimeSlicing?",
        )
    ]


def test_a_kind_spelt_gpuconfig_is_refused_with_the_spelling_meant() -> None:
    assert check_parameters({"apiVersion": API, "kind": "GPUConfig"}, PATH, gates=DEFAULTS) == [
        refused(
            ".kind",
            "GPUConfig",
            'no kind "GPUConfig" is registered for version "resource.nvidia.com/v1beta1"',
            "did you mean GpuConfig?",
        )
    ]


def test_a_mig_device_config_with_a_time_slicing_config_is_refused() -> None:
    parameters = {
        "apiVersion": API,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    assert check_parameters(parameters, PATH, gates=SHARING_ON) == [
        refused(
            ".sharing.timeSlicingConfig",
            "timeSlicingConfig",
            "a MigDeviceConfig's sharing has no timeSlicingConfig: time-slice settings cannot be "
            "set on MIG devices",
            "remove timeSlicingConfig (strategy TimeSlicing alone is allowed)",
        )
    ]


@pytest.mark.parametrize(
    ("parameters", "gate", "message"),
    [(time_slicing("Long"), "TimeSlicingSettings", TS_GATE), (mps(50), "MPSSupport", MPS_GATE)],
)
def test_a_strategy_is_refused_while_its_gate_is_off_and_accepted_once_on(
    parameters: dict[str, object], gate: str, message: str
) -> None:
    strategy = "TimeSlicing" if gate == "TimeSlicingSettings" else "MPS"
    assert check_parameters(parameters, PATH, gates=DEFAULTS) == [
        refused(
            ".sharing.strategy",
            strategy,
            message,
            f"leave out sharing for exclusive use, or enable the driver's {gate} gate "
            "(and set it in the policy's dra.nvidiaDriver.featureGates)",
        )
    ]
    assert check_parameters(parameters, PATH, gates={**DEFAULTS, gate: True}) == []
    # A gate the caller leaves out has the driver's default: off.
    assert [p.message for p in check_parameters(parameters, PATH, gates={})] == [message]


def test_an_unknown_field_is_only_a_warning() -> None:
    parameters = {"apiVersion": API, "kind": "GpuConfig", "futureField": {"x": 1}}
    assert check_parameters(parameters, PATH, gates=DEFAULTS) == [
        ParameterProblem(
            PATH + ".futureField",
            "futureField",
            'unknown field "futureField" (the driver\'s GpuConfig has apiVersion, kind, '
            "sharing): this driver's strict decoding refuses it; a newer driver may know it",
            "remove it unless your driver's version documents it",
            False,
        )
    ]


def test_every_problem_is_listed_where_the_driver_stops_at_the_first() -> None:
    parameters = {
        "apiVersion": "resource.nvidia.com/v1",
        "kind": "GpuConfig",
        "Sharing": None,
        "sharing": {
            "strategy": "MPS",
            "timeSlicingConfig": {"interval": "Long"},
            "mpsConfig": {
                "defaultActiveThreadPercentage": -5,
                "defaultPinnedDeviceMemoryLimit": "1M",
                "defaultPerDevicePinnedMemoryLimit": {"-1": "2Gi", "1": "lots"},
                "multiUser": "yes",
                "mpsFuture": True,
            },
        },
    }
    problems = check_parameters(parameters, PATH, gates=DEFAULTS)
    assert [(p.path[len(PATH) :], p.refused) for p in problems] == [
        (".apiVersion", True),
        (".Sharing", True),
        (".sharing.strategy", True),  # MPSSupport is off
        (".sharing.timeSlicingConfig", True),
        (".sharing.mpsConfig.mpsFuture", False),
        (".sharing.mpsConfig.defaultActiveThreadPercentage", True),
        (".sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", True),
        (".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[-1]", True),
        (".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]", True),
        (".sharing.mpsConfig.multiUser", True),
    ]
    assert problems[1].hint == "did you mean sharing?"


MIG = "MigDeviceConfig"
CHANNEL = "ComputeDomainChannelConfig"
# (parameters, gates, device types, expected (path below PATH, refused, hint) of each problem).
# What the driver's decoder, Normalize, Validate and NodePrepareResources do, case by case.
CASES = [
    # Exclusive use: no sharing, or sharing null.
    ({"apiVersion": API, "kind": "GpuConfig"}, DEFAULTS, None, []),
    ({"apiVersion": API, "kind": "GpuConfig", "sharing": None}, DEFAULTS, None, []),
    ({"apiVersion": API, "kind": MIG}, DEFAULTS, frozenset({"mig"}), []),
    # The decoder: an object, this apiVersion, a kind it knows that is a configuration.
    (
        [API],
        DEFAULTS,
        None,
        [
            (
                "",
                True,
                f"write apiVersion: {API} and the kind for the device class: GpuConfig "
                "(gpu.nvidia.com), MigDeviceConfig (mig.nvidia.com), VfioDeviceConfig "
                "(vfio.gpu.nvidia.com), ComputeDomainDaemonConfig "
                "(compute-domain-daemon.nvidia.com), ComputeDomainChannelConfig "
                "(compute-domain-default-channel.nvidia.com)",
            )
        ],
    ),
    ({"kind": "GpuConfig"}, DEFAULTS, None, [(".apiVersion", True, f"write apiVersion: {API}")]),
    (
        {"apiVersion": "resource.nvidia.com/v1beta2", "kind": "GpuConfig"},
        DEFAULTS,
        None,
        [(".apiVersion", True, f"write apiVersion: {API}")],
    ),
    (
        {"apiVersion": API},
        DEFAULTS,
        frozenset({"gpu"}),
        [(".kind", True, "write the kind for the device class: GpuConfig (gpu.nvidia.com)")],
    ),
    (
        {"apiVersion": API, "kind": 7},
        DEFAULTS,
        frozenset({"mig"}),
        [(".kind", True, "write the kind for the device class: MigDeviceConfig (mig.nvidia.com)")],
    ),
    (
        {"apiVersion": API, "kind": "ComputeDomain"},
        DEFAULTS,
        frozenset({"gpu"}),
        [(".kind", True, "write the kind for the device class: GpuConfig (gpu.nvidia.com)")],
    ),
    (
        {"apiVersion": API, "kind": "GpuPartitionConfig", "partitions": 2},
        DEFAULTS,
        frozenset({"gpu"}),
        [(".kind", False, "write the kind for the device class: GpuConfig (gpu.nvidia.com)")],
    ),
    (
        {"apiVersion": API, "Kind": "GpuConfig"},
        DEFAULTS,
        None,
        [
            (
                ".kind",
                True,
                "write the kind for the device class: GpuConfig (gpu.nvidia.com), "
                "MigDeviceConfig (mig.nvidia.com), VfioDeviceConfig (vfio.gpu.nvidia.com), "
                "ComputeDomainDaemonConfig (compute-domain-daemon.nvidia.com), "
                "ComputeDomainChannelConfig (compute-domain-default-channel.nvidia.com)",
            ),
            (".Kind", True, "did you mean kind?"),
        ],
    ),
    # NodePrepareResources: a config's kind against the type of the devices it names.
    (
        {"apiVersion": API, "kind": "GpuConfig"},
        DEFAULTS,
        frozenset({"mig"}),
        [(".kind", True, "write the kind for the device class: MigDeviceConfig (mig.nvidia.com)")],
    ),
    (
        {"apiVersion": API, "kind": MIG},
        DEFAULTS,
        frozenset({"gpu", "mig"}),
        [
            (
                ".kind",
                True,
                "write the kind for the device class: GpuConfig (gpu.nvidia.com), "
                "MigDeviceConfig (mig.nvidia.com)",
            )
        ],
    ),
    # Sharing: no default strategy, the exact spellings, objects where objects are due.
    (
        gpu_config(),
        SHARING_ON,
        None,
        [
            (
                ".sharing.strategy",
                True,
                "write strategy: TimeSlicing or MPS, or leave out sharing for exclusive use",
            ),
        ],
    ),
    (
        gpu_config(strategy=""),
        SHARING_ON,
        None,
        [
            (
                ".sharing.strategy",
                True,
                "write strategy: TimeSlicing or MPS, or leave out sharing for exclusive use",
            ),
        ],
    ),
    (
        gpu_config(strategy="mps"),
        SHARING_ON,
        None,
        [(".sharing.strategy", True, "did you mean MPS?")],
    ),
    (
        gpu_config(strategy="Exclusive"),
        SHARING_ON,
        None,
        [
            (".sharing.strategy", True, "write one of TimeSlicing, MPS"),
        ],
    ),
    (gpu_config(strategy=1), SHARING_ON, None, [(".sharing.strategy", True, "quote the value")]),
    (
        {"apiVersion": API, "kind": "GpuConfig", "sharing": "MPS"},
        SHARING_ON,
        None,
        [(".sharing", True, "write sharing as a mapping")],
    ),
    (
        gpu_config(strategy="MPS", mpsconfig={}),
        SHARING_ON,
        None,
        [
            (".sharing.mpsconfig", True, "did you mean mpsConfig?"),
        ],
    ),
    (
        gpu_config(strategy="TimeSlicing", timeSlicingConfg={}),
        SHARING_ON,
        None,
        [
            (".sharing.timeSlicingConfg", True, "did you mean timeSlicingConfig?"),
        ],
    ),
    # Time-slicing: null or absent is interval Default (Normalize); an interval Validate reads
    # unchecked (an empty timeSlicingConfig fails the driver); the exact interval names.
    (gpu_config(strategy="TimeSlicing"), SHARING_ON, None, []),
    (gpu_config(strategy="TimeSlicing", timeSlicingConfig=None), SHARING_ON, None, []),
    (
        gpu_config(strategy="TimeSlicing", timeSlicingConfig={}),
        SHARING_ON,
        None,
        [
            (
                ".sharing.timeSlicingConfig.interval",
                True,
                "write interval: Default, Short, Medium, "
                "Long, or leave out timeSlicingConfig (interval Default)",
            ),
        ],
    ),
    (
        time_slicing("long"),
        SHARING_ON,
        None,
        [
            (".sharing.timeSlicingConfig.interval", True, "did you mean Long?"),
        ],
    ),
    (
        time_slicing(""),
        SHARING_ON,
        None,
        [
            (
                ".sharing.timeSlicingConfig.interval",
                True,
                "write one of Default, Short, Medium, Long",
            ),
        ],
    ),
    (
        gpu_config(strategy="TimeSlicing", timeSlicingConfig=[]),
        SHARING_ON,
        None,
        [
            (".sharing.timeSlicingConfig", True, "write timeSlicingConfig as a mapping"),
        ],
    ),
    # A MIG device: TimeSlicing alone; an mpsConfig under it is ignored by the driver.
    (
        {"apiVersion": API, "kind": MIG, "sharing": {"strategy": "TimeSlicing"}},
        SHARING_ON,
        frozenset({"mig"}),
        [],
    ),
    (
        {"apiVersion": API, "kind": MIG, "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}},
        SHARING_ON,
        None,
        [(".sharing.mpsConfig", False, "remove mpsConfig, or use strategy MPS")],
    ),
    (
        {
            "apiVersion": API,
            "kind": MIG,
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}},
        },
        SHARING_ON,
        None,
        [],
    ),
    # MPS: null is an empty config; 0..100 whole; pinned limits of at least 1Mi (whole MiB).
    (gpu_config(strategy="MPS"), SHARING_ON, None, []),
    (gpu_config(strategy="MPS", mpsConfig=None), SHARING_ON, None, []),
    (mps(0), SHARING_ON, None, []),
    (mps(100), SHARING_ON, None, []),
    (
        gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 50.0}),
        SHARING_ON,
        None,
        [
            (
                ".sharing.mpsConfig.defaultActiveThreadPercentage",
                True,
                "write a percentage from 0 to 100",
            )
        ],
    ),
    (
        gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": True}),
        SHARING_ON,
        None,
        [
            (
                ".sharing.mpsConfig.defaultActiveThreadPercentage",
                True,
                "write a percentage from 0 to 100",
            )
        ],
    ),
    (
        gpu_config(
            strategy="MPS",
            mpsConfig={
                "defaultPinnedDeviceMemoryLimit": "1Mi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "10Gi", "GPU-8c8d4f9e": 2**20},
                "multiUser": True,
            },
        ),
        SHARING_ON,
        None,
        [],
    ),
    (
        gpu_config(
            strategy="MPS",
            mpsConfig={
                "defaultPinnedDeviceMemoryLimit": "1048575",
                "defaultPerDevicePinnedMemoryLimit": {"+0": "-1Gi", "1": None, "2": "1.5"},
            },
        ),
        SHARING_ON,
        None,
        [
            (
                ".sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                True,
                "write at least 1Mi (a size such as 10Gi)",
            ),
            (
                ".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[+0]",
                True,
                "write at least 1Mi (a size such as 10Gi)",
            ),
            (
                ".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]",
                True,
                "write at least 1Mi (a size such as 10Gi)",
            ),
            (
                ".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[2]",
                True,
                "write at least 1Mi (a size such as 10Gi)",
            ),
        ],
    ),
    (
        gpu_config(strategy="MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": ["1Gi"]}),
        SHARING_ON,
        None,
        [
            (
                ".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit",
                True,
                "write defaultPerDevicePinnedMemoryLimit as a mapping",
            )
        ],
    ),
    # VFIO: iommu optional; an empty backend policy is LegacyOnly (Normalize).
    ({"apiVersion": API, "kind": "VfioDeviceConfig"}, DEFAULTS, frozenset({"vfio"}), []),
    (
        {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": ""}},
        DEFAULTS,
        None,
        [],
    ),
    (
        {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "IommuFD"}},
        DEFAULTS,
        None,
        [(".iommu.backendPolicy", True, "write one of LegacyOnly, PreferIommuFD")],
    ),
    (
        {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"enableApiDevice": True}},
        DEFAULTS,
        None,
        [(".iommu.enableApiDevice", True, "did you mean enableAPIDevice?")],
    ),
    # ComputeDomains: a domainID; allocationMode compared with "All" only.
    (
        {"apiVersion": API, "kind": CHANNEL, "domainID": "b3f6", "allocationMode": "All"},
        DEFAULTS,
        frozenset({"channel"}),
        [],
    ),
    (
        {"apiVersion": API, "kind": CHANNEL, "domainID": "", "allocationMode": "all"},
        DEFAULTS,
        None,
        [
            (
                ".domainID",
                True,
                "write the ComputeDomain's UID (the ComputeDomain controller "
                "writes it in the claim templates it creates)",
            ),
            (".allocationMode", False, "did you mean All?"),
        ],
    ),
    (
        {"apiVersion": API, "kind": "ComputeDomainDaemonConfig"},
        DEFAULTS,
        frozenset({"daemon"}),
        [
            (
                ".domainID",
                True,
                "write the ComputeDomain's UID (the ComputeDomain controller "
                "writes it in the claim templates it creates)",
            )
        ],
    ),
]


@pytest.mark.parametrize(("parameters", "gates", "device_types", "expected"), CASES)
def test_the_driver_refuses_what_is_refused_and_accepts_the_rest(
    parameters: object,
    gates: Mapping[str, bool],
    device_types: frozenset[str] | None,
    expected: list[tuple[str, bool, str]],
) -> None:
    problems = check_parameters(parameters, PATH, gates=gates, device_types=device_types)
    assert [(p.path[len(PATH) :], p.refused, p.hint) for p in problems] == expected


@pytest.mark.parametrize(
    ("word", "meant"),
    [
        ("GPUConfig", "GpuConfig"),  # case
        ("GpuConfg", "GpuConfig"),  # a letter dropped
        ("GpuConfiig", "GpuConfig"),  # one added
        ("GpuCunfig", "GpuConfig"),  # one changed
        ("GpuConifg", "GpuConfig"),  # two swapped
        ("gPUcONFIg", "GpuConfig"),
        ("MigConfig", None),  # three letters dropped
        ("GpuCnofgi", None),  # two swaps
        ("GpuConfigs2", None),  # two added
    ],
)
def test_a_near_miss_is_case_or_one_edit(word: str, meant: str | None) -> None:
    assert near_miss(word, ["GpuConfig", "VfioDeviceConfig"]) == meant


@pytest.mark.parametrize(
    ("parameters", "strategy"),
    [
        (gpu_config(strategy="MPS"), "MPS"),
        ({"kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}, "TimeSlicing"),
        ({"apiVersion": "wrong", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}, "MPS"),
        (gpu_config(strategy="Timeslicing"), None),
        ({"apiVersion": API, "kind": "GpuConfig"}, None),
        ({"apiVersion": API, "kind": "GpuConfig", "sharing": None}, None),
        ({"kind": "VfioDeviceConfig", "sharing": {"strategy": "MPS"}}, None),
        ("MPS", None),
    ],
)
def test_the_sharing_strategy_is_read_without_judging(
    parameters: object, strategy: str | None
) -> None:
    assert sharing_strategy(parameters) == strategy


def corpus_parameters() -> Iterator[tuple[str, int, dict[str, object]]]:
    """(file, config index, parameters) of every config for NVIDIA's GPU driver in the corpus."""
    for path in sorted(DRA_CORPUS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text("utf-8")):
            if not document or not document["kind"].startswith("ResourceClaim"):
                continue
            spec = (
                document["spec"]["spec"]
                if document["kind"].endswith("Template")
                else document["spec"]
            )
            configs = (spec.get("devices") or {}).get("config") or []
            for index, config in enumerate(configs):
                if (config.get("opaque") or {}).get("driver") == GPU_DRIVER:
                    yield path.name, index, config["opaque"]["parameters"]


@pytest.mark.skipif(not DRA_CORPUS.is_dir(), reason=f"the DRA corpus is not at {DRA_CORPUS}")
def test_the_corpus_configs_are_accepted_with_the_gates_they_need() -> None:
    found = {(name, index): parameters for name, index, parameters in corpus_parameters()}
    assert sorted(found) == [
        ("dra-driver-nvidia-gpu__bats-gpu-simple-mig-timeslicing.yaml", 0),
        ("dra-driver-nvidia-gpu__quickstart-v1-gpu-test-vfio-config.yaml", 0),
        ("dra-driver-nvidia-gpu__quickstart-v1-gpu-test5-timeslicing-mps.yaml", 0),
        ("dra-driver-nvidia-gpu__quickstart-v1-gpu-test5-timeslicing-mps.yaml", 1),
        ("dra-driver-nvidia-gpu__quickstart-v1beta1-gpu-test5-timeslicing-mps.yaml", 0),
        ("dra-driver-nvidia-gpu__quickstart-v1beta1-gpu-test5-timeslicing-mps.yaml", 1),
    ]
    for parameters in found.values():
        assert check_parameters(parameters, PATH, gates=SHARING_ON) == []
    # Under the driver's defaults, the sharing ones are refused for their gate alone.
    refusals = {
        key: [p.message for p in check_parameters(parameters, PATH, gates=DEFAULTS)]
        for key, parameters in found.items()
    }
    assert sorted(set(map(tuple, refusals.values()))) == [(), (MPS_GATE,), (TS_GATE,)]


def test_a_long_key_or_value_is_cut_short_in_the_message() -> None:
    long = "x" * 100_000
    parameters = {"apiVersion": API, "kind": long, "sharing": {long: 1}}
    [kind] = check_parameters(parameters, PATH, gates=DEFAULTS)
    assert (kind.value, kind.refused, len(kind.message) < 1000) == (long, False, True)
    [field] = check_parameters(gpu_config(strategy="MPS", **{long: 1}), PATH, gates=SHARING_ON)
    assert (field.path, field.value, len(field.message) < 1000) == (
        f"{PATH}.sharing.{long}",
        long,
        True,
    )
