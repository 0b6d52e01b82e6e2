"""The checks every number of a hardware file goes through (hw_model/hardware.py and its energy tables,
hw_model/energy_spec.py), in one place: a real number (not a bool), within float range, finite, positive or
non-negative as asked, and inside the range of a hardware value; errors name the field and show the value."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hw_model.errors import HardwareConfigError
from hw_model.units import finite_number  # the one test of a number read from a file


def shown_number(value: object) -> str:
    """``value`` for an error message: its repr, or the size of an integer too long to print."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        beyond = " (beyond float range)" if value.bit_length() > 1024 else ""
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits{beyond}"
    return repr(value)


# The range a non-zero hardware number may take: wider than any real system (10^-30 s, 10^30 FLOP/s), narrow
# enough that every product and quotient the simulator forms stays a normal float (a 5e-324 bandwidth made an
# expert's transfer time infinite, refused only later by the packer).
MIN_HARDWARE_VALUE = 1e-30
MAX_HARDWARE_VALUE = 1e30
MAX_GEMM_TILE_M = 1 << 16


def require_positive(where: str, value: float, allow_zero: bool = False) -> None:
    """:class:`HardwareConfigError` naming ``where`` unless ``value`` is a positive (or, ``allow_zero``,
    non-negative) number within the range of a hardware value."""
    bound = "a non-negative" if allow_zero else "a positive"
    number = finite_number(value)  # None for a non-number, NaN/inf and an integer beyond float range
    if number is None or not (number >= 0 if allow_zero else number > 0):
        raise HardwareConfigError(f"{where} must be {bound} number, got {shown_number(value)}")
    if number != 0 and not MIN_HARDWARE_VALUE <= number <= MAX_HARDWARE_VALUE:
        raise HardwareConfigError(
            f"{where} = {number:g} is outside the range of a hardware value "
            f"({MIN_HARDWARE_VALUE:g} to {MAX_HARDWARE_VALUE:g}, hw_model/spec_numbers.py)"
        )


def require_per_dtype(where: str, table: Mapping[str, float], known: Iterable[str], what: str) -> None:
    """:class:`HardwareConfigError` unless ``table`` lists ``what`` for at least one dtype, each of them one of
    ``known`` and each value a positive hardware number."""
    known_dtypes = tuple(known)
    if not table:
        raise HardwareConfigError(f"{where} must list {what} for at least one dtype")
    for dtype, value in table.items():
        if dtype not in known_dtypes:
            raise HardwareConfigError(f"{where}.{dtype}: unknown dtype (known: {', '.join(known_dtypes)})")
        require_positive(f"{where}.{dtype}", value)
