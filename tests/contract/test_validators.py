"""kvcore.validators: ints are ints (never bools), numbers are numbers, and errors say what came."""

import attrs
import pytest

from kvcore.errors import InvalidInputError, InvalidSpecError, KVCoreError, ModelConfigError
from kvcore.validators import check_int, int_at_least, is_int, is_number, non_negative_int, positive_int


class _Odd(int):
    """An int subclass that is not a bool: still an int."""


@pytest.mark.parametrize(("value", "expected"), [(0, True), (-3, True), (2**70, True), (_Odd(5), True)])
def test_is_int_accepts_ints(value, expected):
    assert is_int(value) is expected


@pytest.mark.parametrize("value", [True, False, 1.0, 2.5, "1", None, [1], 1 + 0j])
def test_is_int_refuses_bools_floats_and_the_rest(value):
    assert is_int(value) is False


@pytest.mark.parametrize("value", [0, 3, 0.5, -1.5, float("inf")])
def test_is_number_accepts_ints_and_floats(value):
    assert is_number(value) is True


@pytest.mark.parametrize("value", [True, False, "0.5", None, 1j])
def test_is_number_refuses_bools_and_the_rest(value):
    assert is_number(value) is False


def test_check_int_returns_the_value():
    assert check_int(7, "'n'") == 7
    assert check_int(0, "'n'", minimum=0) == 0
    assert check_int(3, "'i'", minimum=0, below=4) == 3


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (True, {"minimum": 1}, "'n' must be an int >= 1 (got True, a bool)"),
        (1.5, {"minimum": 1}, "'n' must be an int >= 1 (got 1.5, a float)"),
        ("8", {}, "'n' must be an int (got '8', a str)"),
        (0, {"minimum": 1}, "'n' must be an int >= 1 (got 0)"),
        (-1, {"minimum": 0}, "'n' must be an int >= 0 (got -1)"),
        (4, {"minimum": 0, "below": 4}, "'n' must be an int in [0, 4) (got 4)"),
        (-1, {"minimum": 0, "below": 4}, "'n' must be an int in [0, 4) (got -1)"),
        (9, {"below": 9}, "'n' must be an int < 9 (got 9)"),
    ],
)
def test_check_int_says_the_limit_and_what_came(value, kwargs, message):
    with pytest.raises(InvalidInputError) as info:
        check_int(value, "'n'", **kwargs)
    assert str(info.value) == message


def test_check_int_raises_the_error_class_it_is_given_with_the_owner():
    with pytest.raises(ModelConfigError, match=r"^llama config: 'head_dim' must be an int >= 1 \(got 0\)$"):
        check_int(0, "'head_dim'", minimum=1, error=ModelConfigError, owner="llama config: ")
    with pytest.raises(KVCoreError, match=r"^rank 3: the world size"):
        check_int(False, "the world size", minimum=1, owner="rank 3: ")


@attrs.frozen
class _Options:
    count: int = attrs.field(validator=int_at_least(1, owner="option "))
    offset: int = attrs.field(default=0, validator=int_at_least(0, error=ModelConfigError))


def test_int_at_least_names_the_field():
    assert _Options(count=2).count == 2
    with pytest.raises(InvalidInputError, match=r"^option 'count' must be an int >= 1 \(got 0\)$"):
        _Options(count=0)
    with pytest.raises(InvalidInputError, match=r"^option 'count' must be an int >= 1 \(got True, a bool\)$"):
        _Options(count=True)
    with pytest.raises(ModelConfigError, match=r"^'offset' must be an int >= 0 \(got -2\)$"):
        _Options(count=1, offset=-2)


@attrs.frozen
class _Spec:
    kind = "acme.ring"
    slots: int = attrs.field(validator=positive_int)
    start: int = attrs.field(default=0, validator=non_negative_int)


@attrs.frozen
class _Nameless:
    size: int = attrs.field(validator=non_negative_int)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slots": 0}, "acme.ring: 'slots' must be >= 1 (got 0)"),
        ({"slots": True}, "acme.ring: 'slots' must be a positive int (got True that is a bool)"),
        ({"slots": 2.0}, "acme.ring: 'slots' must be a positive int (got 2.0 that is a float)"),
        ({"slots": 1, "start": -1}, "acme.ring: 'start' must be >= 0 (got -1)"),
        ({"slots": 1, "start": False}, "acme.ring: 'start' must be an int >= 0 (got False that is a bool)"),
    ],
)
def test_spec_validators_raise_invalid_spec_error_naming_the_kind(kwargs, message):
    with pytest.raises(InvalidSpecError) as info:
        _Spec(**kwargs)
    assert str(info.value) == message


def test_spec_validators_name_the_class_without_a_kind():
    with pytest.raises(InvalidSpecError, match=r"^_Nameless: 'size' must be >= 0 \(got -1\)$"):
        _Nameless(size=-1)


def test_spec_module_still_exports_the_spec_validators():
    import kvcore.spec

    assert kvcore.spec.positive_int is positive_int
    assert kvcore.spec.non_negative_int is non_negative_int


def test_errors_are_value_errors_for_callers_that_catch_those():
    with pytest.raises(ValueError):
        check_int("x", "'n'")
