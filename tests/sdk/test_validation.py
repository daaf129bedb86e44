"""``request_resources`` refuses bad arguments exactly as Ray 2.60 does."""

from __future__ import annotations

from typing import Any

import pytest

from gcs.base.labels import label_selector_error
from gcs.sdk import AddressNotFound, GcsSdkError, resolve_address, validate_request
from tests.sdk.cases import BAD_ARGUMENTS, GOOD_ARGUMENTS


class TestValidation:
    @pytest.mark.parametrize(
        ("kwargs", "error", "message"),
        [pytest.param(k, e, m, id=i) for i, k, e, m in BAD_ARGUMENTS],
    )
    def test_bad_arguments_raise_rays_error_type_and_message(
        self, kwargs: dict[str, Any], error: str, message: str
    ) -> None:
        """Each bad input raises the same exception class and text as Ray's SDK."""
        with pytest.raises(Exception) as info:
            validate_request(**kwargs)
        assert type(info.value).__name__ == error
        assert str(info.value) == message

    @pytest.mark.parametrize("kwargs", [pytest.param(k, id=i) for i, k in GOOD_ARGUMENTS])
    def test_good_arguments_pass(self, kwargs: dict[str, Any]) -> None:
        """Inputs Ray accepts are accepted."""
        validate_request(**kwargs)

    def test_request_resources_validates_before_looking_for_an_address(self) -> None:
        """A bad argument is reported even when no GCS address is configured."""
        from gcs.sdk import request_resources

        with pytest.raises(TypeError, match=r"num_cpus should be of type int\."):
            request_resources(num_cpus="x", address=None)  # type: ignore[arg-type]


class TestLabelSyntax:
    @pytest.mark.parametrize(
        "value", ["spot", "!GPU", "213521", "in(A123, B456, C789)", "!in(spot, on-demand)", ""]
    )
    def test_rays_documented_valid_values_pass(self, value: str) -> None:
        """The examples Ray's regex comment calls valid are valid."""
        assert label_selector_error({"k": value}) is None

    @pytest.mark.parametrize(
        "value", ["-spot", "spot_", "in()", "in(spot,", "in(H100, TPU!GPU)", "!!!in(H100, TPU)"]
    )
    def test_rays_documented_invalid_values_fail(self, value: str) -> None:
        """The examples Ray's regex comment calls invalid are invalid."""
        assert label_selector_error({"k": value}) is not None

    def test_keys_are_checked_before_values(self) -> None:
        """A selector with a bad key and a bad value reports the key."""
        problem = label_selector_error({"-k": "-v"})
        assert problem is not None and problem.startswith("Invalid label key name `-k`")


class TestAddress:
    def test_explicit_address_wins(self) -> None:
        """The argument beats both environment variables."""
        env = {"GCS_ADDRESS": "a:1", "RAY_ADDRESS": "b:2"}
        assert resolve_address("c:3", env) == "c:3"

    def test_gcs_address_beats_ray_address(self) -> None:
        """``GCS_ADDRESS`` is consulted before ``RAY_ADDRESS``."""
        assert resolve_address(None, {"GCS_ADDRESS": "a:1", "RAY_ADDRESS": "b:2"}) == "a:1"
        assert resolve_address(None, {"RAY_ADDRESS": "b:2"}) == "b:2"

    @pytest.mark.parametrize("env", [{}, {"RAY_ADDRESS": "auto"}, {"GCS_ADDRESS": " "}])
    def test_no_address_is_a_clear_error(self, env: dict[str, str]) -> None:
        """Without any usable address the error names the ways to give one."""
        with pytest.raises(AddressNotFound, match="GCS_ADDRESS") as info:
            resolve_address(None, env)
        assert isinstance(info.value, GcsSdkError)
