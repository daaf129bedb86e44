"""Argument cases shared by the SDK unit tests and the cross-check against Ray 2.60 itself."""

from __future__ import annotations

from typing import Any

KEY_HINT = (
    "with an alphanumeric character ([a-z0-9A-Z]) with dashes (-), underscores (_),"
    "dots (.), and alphanumerics between."
)
SHAPE = (
    "Bundle label selector must be a list of string dictionary label selectors. For example: "
    '`[{ray.io/market_type": "spot"}, {"ray.io/accelerator-type": "A100"}]`.'
)


def _selector_value(value: str) -> str:
    return (
        "Invalid label selector provided in bundle_label_selectors list. Detailed error: "
        f"'Invalid label selector value `{value}`. The label selector value should contain "
        "optional operators and a label value. Supported operators are: ! and {'in'}. "
        f"Value must be 63 chars or less beginning and ending {KEY_HINT}'"
    )


def _key_name(name: str) -> str:
    return (
        "Invalid label selector provided in bundle_label_selectors list. Detailed error: "
        f"'Invalid label key name `{name}`. Name must be 63 chars or less beginning and "
        f"ending {KEY_HINT}'"
    )


def _key_prefix(prefix: str) -> str:
    return (
        "Invalid label selector provided in bundle_label_selectors list. Detailed error: "
        f"'Invalid label key prefix `{prefix}`. Prefix must be a series of DNS labels "
        "separated by dots (.), not longer than 253 characters in total.'"
    )


# (id, kwargs, exception type name, exact message)
BAD_ARGUMENTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("num_cpus-float", {"num_cpus": 1.5}, "TypeError", "num_cpus should be of type int."),
    ("num_cpus-str", {"num_cpus": "4"}, "TypeError", "num_cpus should be of type int."),
    ("bundles-tuple", {"bundles": ({"CPU": 1},)}, "TypeError", "bundles should be of type List"),
    ("bundles-dict", {"bundles": {"CPU": 1}}, "TypeError", "bundles should be of type List"),
    ("bundle-not-dict", {"bundles": [["CPU", 1]]}, "TypeError", "each bundle should be a Dict."),
    ("bundle-key-int", {"bundles": [{1: 1}]}, "TypeError", "each bundle key should be str."),
    (
        "bundle-value-bool",
        {"bundles": [{"CPU": True}]},
        "TypeError",
        "each bundle value should be a number (int or float).",
    ),
    (
        "bundle-value-str",
        {"bundles": [{"CPU": "1"}]},
        "TypeError",
        "each bundle value should be a number (int or float).",
    ),
    (
        "selectors-without-bundles",
        {"bundle_label_selectors": [{"a": "b"}]},
        "ValueError",
        "`bundles` must be provided when `bundle_label_selectors` is specified.",
    ),
    (
        "selectors-length",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": [{}, {}]},
        "ValueError",
        "`bundle_label_selector` must be a list with length equal to the number of bundles.",
    ),
    (
        "selector-not-dict",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": ["a=b"]},
        "ValueError",
        SHAPE,
    ),
    (
        "selector-value-int",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": [{"a": 1}]},
        "ValueError",
        SHAPE,
    ),
    (
        "selector-bad-value",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": [{"a": "-spot"}]},
        "ValueError",
        _selector_value("-spot"),
    ),
    (
        "selector-empty-in",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": [{"a": "in()"}]},
        "ValueError",
        _selector_value("in()"),
    ),
    (
        "selector-double-bang",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": [{"a": "!!x"}]},
        "ValueError",
        _selector_value("!!x"),
    ),
    (
        "selector-bad-key",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": [{"-a": "x"}]},
        "ValueError",
        _key_name("-a"),
    ),
    (
        "selector-bad-prefix",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": [{"a_/b": "x"}]},
        "ValueError",
        _key_prefix("a_"),
    ),
    (
        "selector-long-value",
        {"bundles": [{"CPU": 1}], "bundle_label_selectors": [{"a": "x" * 64}]},
        "ValueError",
        _selector_value("x" * 64),
    ),
]

# (id, kwargs) accepted by Ray's validation; used for wire comparisons too.
GOOD_ARGUMENTS: list[tuple[str, dict[str, Any]]] = [
    ("nothing", {}),
    ("num-cpus", {"num_cpus": 3}),
    ("num-cpus-zero", {"num_cpus": 0}),
    ("cpus-and-bundles", {"num_cpus": 2, "bundles": [{"CPU": 1}, {"GPU": 1, "CPU": 4}]}),
    ("float-and-zero", {"bundles": [{"CPU": 0.5, "GPU": 0}, {"CPU": 0.5, "GPU": 0}, {}]}),
    (
        "selectors",
        {
            "bundles": [{"CPU": 1}, {"CPU": 1}, {"GPU": 1, "CPU": 4}, {"CPU": 1}],
            "bundle_label_selectors": [
                {"market-type": "spot"},
                {"market-type": "spot"},
                {"accelerator-type": "in(A100,H100)", "market": "!spot"},
                {},
            ],
        },
    ),
    (
        "selector-forms",
        {
            "bundles": [{"CPU": 1}],
            "bundle_label_selectors": [
                {
                    "ray.io/zone": "!in(us-a, us-b)",
                    "k": "in(a,a,b)",
                    "lit": "(x,y)",
                    "empty": "",
                    "neg": "!v",
                }
            ],
        },
    ),
]
