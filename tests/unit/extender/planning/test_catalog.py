"""The instance-type catalog: the issue's format, TFLOPS from the GPU model table, extending or replacing the
built-in one, a ConfigMap, and every bad entry named."""

from __future__ import annotations

import pytest

from extender.planning.amounts import Amount, CapacityError
from extender.planning.catalog import DEFAULT_CATALOG, parse_catalog
from tests.unit.fixtures.planning import CATALOG, GI, T


def test_catalog_reads_the_issue_format_and_fills_tflops_from_the_model_table() -> None:
    fat = CATALOG.get("fat.x1")
    assert fat is not None and fat.tflops_per_gpu == T(362) and fat.vram_per_gpu == 48 * GI
    assert CATALOG.get("arm.x1") is not None and CATALOG.get("arm.x1").prices == {"on-demand": T("0.42")}
    assert [t.name for t in CATALOG.types] == ["arm.x1", "big.x4", "fat.x1", "small.x1"]


def test_catalog_extends_and_overrides_the_builtin_default() -> None:
    merged = parse_catalog(
        "instanceTypes:\n- {name: g5.xlarge, gpuModel: A10G, prices: {on-demand: 9}}\n"
        "- {name: my.gpu, gpuModel: H100, gpuCount: 2, prices: {spot: 3}}\n"
    )
    assert len(merged.types) == len(DEFAULT_CATALOG.types) + 1
    assert merged.get("g5.xlarge").prices == {"on-demand": T(9)}
    assert merged.get("my.gpu").capacity == Amount(T(989) * 2, 160 * GI)


def test_catalog_from_a_configmap() -> None:
    text = (
        "kind: ConfigMap\ndata:\n  catalog.yaml: |\n    replaceDefaults: true\n    instanceTypes:\n"
        "    - {name: a.b, gpuModel: T4, prices: {on-demand: 1}}\n"
    )
    assert [t.name for t in parse_catalog(text).types] == ["a.b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("instanceTypes: [{gpuModel: T4, prices: {on-demand: 1}}]", "needs a name"),
        ("instanceTypes: [{name: x, gpuModel: Q9, prices: {on-demand: 1}}]", "give tflopsPerGPU"),
        ("instanceTypes: [{name: x, gpuModel: T4}]", "prices"),
        ("instanceTypes: [{name: x, gpuModel: T4, prices: {cheap: 1}}]", "unknown capacity type 'cheap'"),
        ("instanceTypes: [{name: x, gpuModel: T4, prices: {spot: -1}}]", "must not be negative"),
        ("instanceTypes: [{name: x, gpuModel: T4, gpuCount: 0, prices: {spot: 1}}]", "gpuCount=0"),
        (
            "instanceTypes: [{name: x, gpuModel: T4, vramPerGPU: lots, prices: {spot: 1}}]",
            "vramPerGPU='lots'",
        ),
        ("[1, 2]", "instanceTypes list"),
        ("instanceTypes: [3]", "expected a map"),
    ],
)
def test_bad_catalogs_are_named(text: str, message: str) -> None:
    with pytest.raises(CapacityError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_catalog(text)



@pytest.mark.parametrize(("text", "needle"), [
    ("instanceTypes:\n- {name: x, gpuModel: A10G, prices: {on-demand: 1}, vcpu: lots}\n",
     ".vcpu: 'lots' is not"),
    ("instanceTypes:\n- {name: x, gpuModel: A10G, prices: {on-demand: 1}, vcpu: " + "9" * 5000 + "}\n",
     "catalog: not readable YAML"),
])
def test_a_catalog_number_that_cannot_be_read_is_a_named_error(text: str, needle: str) -> None:
    with pytest.raises(CapacityError, match="") as exc:
        parse_catalog(text)
    assert needle in str(exc.value) and len(str(exc.value)) < 300
