"""Correctly rounded roots, left-fold sums and exact sums: the float64 arithmetic that gives
the same bits on every CPU."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

CPU_SLICE_VALUES = 1 << 18
"""Values :func:`sqrt_rn` corrects at once on the CPU: its dozen float64 temporaries stay 2 MiB
each, reused from slice to slice, where a million groups' roots made some 100 MB of them."""

_SPLITTER = 134217729.0  # 2**27 + 1: Veltkamp's split of a float64 into two halves of 26 bits


def sqrt_rn(x: Tensor) -> Tensor:
    """The correctly rounded square root (IEEE 754's ``sqrt``), the same bits on every CPU.

    ``torch.sqrt`` on the CPU goes through the vector-math library of the machine it runs on
    (MKL's, chosen by CPU), whose float64 results are within an ulp but not always the nearest:
    about 1 in 80 differs from ``math.sqrt``, and which ones depends on the CPU. Here each root
    is corrected to the nearest float64 by its exact residual ``x - y*y`` (Dekker's product, no
    fused multiply-add needed); values beyond ``2**+-960``, where that product would overflow or
    lose bits, are first brought near 1 by an exact power of two. Zeros, infinities, NaN and
    negatives keep IEEE's answers. A float32 or float16 tensor takes the float64 root rounded
    once more, which is its own correctly rounded root.

    ``x``: any shape, a floating dtype; the result has its shape and dtype.

    >>> sqrt_rn(torch.tensor([2.0, 0.0, -1.0, float("inf")], dtype=torch.float64)).tolist()
    [1.4142135623730951, 0.0, nan, inf]
    >>> import math
    >>> xs = torch.linspace(0.5, 1e6, 100_001, dtype=torch.float64)
    >>> sqrt_rn(xs).tolist() == [math.sqrt(v) for v in xs.tolist()]
    True
    """
    if not x.is_floating_point():
        raise TypeError(f"sqrt_rn takes a floating tensor, got {x.dtype}")
    if x.dtype != torch.float64:
        return sqrt_rn(x.to(torch.float64)).to(x.dtype)
    if x.device.type == "cpu" and x.numel() > CPU_SLICE_VALUES:
        # each root is its own value's: slices give the same bits, with temporaries in cache
        flat, out = x.reshape(-1), torch.empty(x.shape, dtype=x.dtype).view(-1)
        for start in range(0, flat.numel(), CPU_SLICE_VALUES):
            out[start : start + CPU_SLICE_VALUES] = sqrt_rn(flat[start : start + CPU_SLICE_VALUES])
        return out.view(x.shape)
    if bool((((x >= _DEKKER_LOW) & (x <= _DEKKER_HIGH)) | (x == 0)).all()):  # NaN fails every test
        return _nearest_root(x, x.sqrt())  # the library's root is within an ulp: one step corrects it
    return _scaled_sqrt_rn(x, torch.isfinite(x) & (x > 0))


_DEKKER_LOW, _DEKKER_HIGH = 2.0**-960, 2.0**960
"""Where Dekker's product of a root with itself neither overflows nor loses its low bits."""


def _scaled_sqrt_rn(x: Tensor, ordinary: Tensor) -> Tensor:
    """:func:`sqrt_rn` of any float64 values: each brought to ``[0.5, 2)`` by an even power of two."""
    mantissa, exponent = torch.frexp(torch.where(ordinary, x, torch.ones_like(x)))
    odd = exponent % 2 != 0  # an even exponent halves exactly
    mantissa = torch.where(odd, mantissa * 2, mantissa)  # in [0.5, 2): exact
    half_exponent = torch.div(exponent - odd.to(exponent.dtype), 2, rounding_mode="floor")
    root = _nearest_root(mantissa, mantissa.sqrt())
    return torch.where(ordinary, torch.ldexp(root, half_exponent), x.sqrt())


def _nearest_root(m: Tensor, y: Tensor) -> Tensor:
    """``y`` (within an ulp of ``sqrt(m)``, ``m`` in ``[2**-960, 2**960]``) moved one float64 up or
    down where a neighbour is nearer ``sqrt(m)``, from the exact residual ``r = m - y*y``: ``y`` is
    the nearest where ``-y*gap_below < r <= y*gap_above`` (no root of a float64 lies halfway, and
    ``r`` and the bounds are multiples of ``ulp(y)**2``)."""
    product = y * y
    split = _SPLITTER * y
    high = split - (split - y)
    low = y - high
    error = ((high * high - product) + 2 * high * low) + low * low  # y*y == product + error exactly
    residual = (m - product) - error  # m - product is exact (Sterbenz): one rounding, far from the bounds
    bits = y.view(torch.int64)
    # the gaps to the next float64 up and down, from the exponent bits (powers of two: exact products)
    gap_above = torch.bitwise_and(bits, _EXPONENT_BITS).view(torch.float64) * 2.0**-52
    gap_below = torch.bitwise_and(bits - 1, _EXPONENT_BITS).view(torch.float64) * 2.0**-52
    step = (residual > y * gap_above).to(torch.int64) - (residual <= -(y * gap_below)).to(torch.int64)
    return (bits + step).view(torch.float64)


_EXPONENT_BITS = 0x7FF0000000000000


def fold_sum(values: Tensor, dim: int = 0) -> Tensor:
    """The sum along ``dim`` as a left fold from ``+0.0``, in index order, the same bits on every
    CPU and thread count (``Tensor.sum`` adds in an order that follows the vector width).

    ``values``: any shape, a floating dtype; the result drops ``dim``.

    >>> fold_sum(torch.tensor([1e16, 1.0, 1.0, -1e16], dtype=torch.float64)).item()
    0.0
    >>> fold_sum(torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64), dim=1).tolist()
    [0.6000000000000001]
    """
    if values.shape[dim] == 0:
        return torch.zeros_like(values.sum(dim))
    return torch.zeros_like(values.select(dim, 0)) + torch.cumsum(values, dim).select(dim, -1)


EXACT_LOWEST_EXPONENT = -4500
"""Every term of an :class:`ExactSum` is a multiple of ``2**EXACT_LOWEST_EXPONENT``: below the
smallest float64 (``2**-1074``) times the smallest squares and products the moments form."""


_BIN_TERMS = 1 << 26
"""Terms summed per exponent in one float64 bincount: 27-bit halves of a 53-bit mantissa add up
exactly below ``2**53``."""


_EXTRACTION_ROUNDS = 4
"""Rounds of :func:`_extracted` before what is left is summed by exponent bins."""


def _exact_terms(values: Tensor) -> Tensor:
    """``values`` as a flat float64 CPU tensor (a copy only where the dtype or device differ)."""
    return values.detach().reshape(-1).to("cpu", torch.float64)


@dataclass(frozen=True)
class ExactSum:
    """A sum of float64 terms kept exactly: ``scaled * 2**EXACT_LOWEST_EXPONENT``, plus the sum
    of any infinite or NaN terms (``special``). Adding two is exact, so parts merge in any order
    and a sum cut into parts (chunks, a Ray run's buckets) has the bits of the whole.

    >>> total = ExactSum.of(torch.tensor([1e16, 1.0, 1.0, -1e16], dtype=torch.float64))
    >>> total.value(), (total + ExactSum.of(torch.tensor([0.5], dtype=torch.float64))).value()
    (2.0, 2.5)
    """

    scaled: int = 0
    special: float = 0.0

    @classmethod
    def of(cls, terms: Tensor, exponents: Tensor | None = None) -> ExactSum:
        """The exact sum of ``terms * 2**exponents`` (a floating and an integer tensor of one
        shape; ``exponents`` defaults to 0), whatever their magnitudes: no product overflows."""
        terms = _exact_terms(terms)
        special = 0.0
        if not math.isfinite(float(terms.sum())):  # one pass: no term is inf or NaN
            finite = torch.isfinite(terms)
            special = float(terms[~finite].sum())  # inf - inf is NaN, whatever the order
            terms = terms[finite]
            exponents = None if exponents is None else exponents.reshape(-1).cpu()[finite]
        if exponents is None:
            return cls(_extracted(terms), special)
        return cls(_binned(terms, exponents.to("cpu", torch.int64).reshape(-1)), special)

    @classmethod
    def of_products(cls, counts: Tensor, values: Tensor) -> ExactSum:
        """The exact sum of ``counts * values`` (int64 and float64, one shape), each product
        rounded once to float64 as a product of the two, never overflowing.

        >>> values = torch.tensor([1e308, -1e308], dtype=torch.float64)
        >>> ExactSum.of_products(torch.tensor([3, 2]), values).value()
        1e+308
        """
        counts, values = counts.detach().reshape(-1).cpu(), _exact_terms(values)
        products = counts * values
        if math.isfinite(float(products.sum())):
            # every float is a multiple of 2**-1074, so a product with an integer that lands
            # below the normal range is exact: these are the products rounded once
            return cls.of(products)
        mantissa, exponent = torch.frexp(values)
        return cls.of(counts * mantissa, exponent)

    def times_power_of_two(self, power: int) -> ExactSum:
        """The sum times ``2**power``, exactly (the terms' bits stay above
        ``2**EXACT_LOWEST_EXPONENT``: ``power`` within +-2048 of the terms' own exponents)."""
        if power >= 0:  # an infinite or NaN special stays what it is
            return ExactSum(self.scaled << power, self.special)
        if self.scaled % (1 << -power):
            raise ValueError(f"the sum times 2**{power} is below 2**{EXACT_LOWEST_EXPONENT}")
        return ExactSum(self.scaled >> -power, self.special)

    def __add__(self, other: ExactSum) -> ExactSum:
        return ExactSum(self.scaled + other.scaled, self.special + other.special)

    def ratio(self, divisor: int, *, scale_exponent: int = 0) -> float:
        """``sum / divisor / 2**scale_exponent``, rounded once (``divisor`` > 0); +-inf past
        the float64 range."""
        if self.special != 0.0:  # an infinite or NaN term (NaN != 0.0 too)
            return self.special
        try:  # an integer quotient is rounded once
            return self.scaled / (divisor << (scale_exponent - EXACT_LOWEST_EXPONENT))
        except OverflowError:
            return math.inf if self.scaled > 0 else -math.inf

    def value(self) -> float:
        """The sum, rounded once."""
        return self.ratio(1)


def _extracted(terms: Tensor) -> int:
    """The exact sum of finite float64 ``terms`` in units of ``2**EXACT_LOWEST_EXPONENT``.

    Rump, Ogita and Oishi's error-free extraction (Accurate floating-point summation, 2008):
    with ``sigma = 2**k`` at least ``n + 1`` times every term's magnitude, ``q = (sigma + p) -
    sigma`` is ``p`` rounded to a multiple of ``2**(k - 53)`` and ``p - q`` is exact, so the
    ``q`` add up exactly in float64 in any order (their sum stays within ``2**53`` units), on
    any CPU and thread count. Each round takes about 53 - log2(n) bits of every term; most
    terms (counts times means of a few rewards) are done in one or two. What is left after
    :data:`_EXTRACTION_ROUNDS`, or near the ends of the float64 range, goes to :func:`_binned`.

    >>> terms = torch.tensor([1e16, 1.0, -1e16, 0.5], dtype=torch.float64)
    >>> _extracted(terms) == 3 << (-1 - EXACT_LOWEST_EXPONENT)
    True
    """
    if not terms.numel():
        return 0
    headroom_bits = int(terms.numel()).bit_length()  # 2**headroom_bits > n
    remainder = terms
    buffer = torch.empty_like(terms)
    scaled = 0
    for _ in range(_EXTRACTION_ROUNDS):
        largest = max(float(remainder.max()), -float(remainder.min()))
        if largest == 0.0:
            return scaled
        k = math.frexp(largest)[1] + headroom_bits  # largest < 2**(k - headroom_bits)
        if k > 1023 or k - 53 < -1022:  # sigma not a float, or its units below the normal range
            break
        sigma = math.ldexp(1.0, k)
        extracted = torch.add(remainder, sigma, out=buffer)
        extracted -= sigma
        units = int(math.ldexp(float(extracted.sum()), 53 - k))  # exact: an integer below 2**53
        scaled += units << (k - 53 - EXACT_LOWEST_EXPONENT)
        if remainder is terms:
            remainder = terms - extracted
        else:
            remainder -= extracted
    return scaled + _binned(remainder, None)


def _binned(terms: Tensor, exponents: Tensor | None) -> int:
    """The exact sum of finite ``terms * 2**exponents`` in units of ``2**EXACT_LOWEST_EXPONENT``:
    each term's 53-bit mantissa, cut in halves of 27 and 26 bits, added per exponent in float64
    (exact up to ``2**26`` terms a bin), then shifted into one integer."""
    mantissa, exponent = torch.frexp(terms)  # terms = mantissa * 2**exponent, |mantissa| in [0.5, 1)
    whole = (mantissa * 2.0**53).to(torch.int64)  # exact: 53 significant bits
    shifts = exponent.to(torch.int64) - 53
    if exponents is not None:
        shifts = shifts + exponents
    scaled = 0
    if whole.numel():  # a zero adds nothing to its exponent's bin, whatever that exponent is
        low_exponent = int(shifts.min())
        if low_exponent < EXACT_LOWEST_EXPONENT:
            raise ValueError(f"a term below 2**{EXACT_LOWEST_EXPONENT} cannot be summed exactly")
        bins = shifts - low_exponent
        high, low = whole >> 26, whole & ((1 << 26) - 1)  # whole = high * 2**26 + low
        width = int(bins.max()) + 1
        for start in range(0, whole.numel(), _BIN_TERMS):
            part = slice(start, start + _BIN_TERMS)
            highs = torch.bincount(bins[part], weights=high[part].to(torch.float64), minlength=width)
            lows = torch.bincount(bins[part], weights=low[part].to(torch.float64), minlength=width)
            for at in torch.nonzero((highs != 0) | (lows != 0)).reshape(-1).tolist():
                shift = at + low_exponent - EXACT_LOWEST_EXPONENT
                scaled += ((int(highs[at]) << 26) + int(lows[at])) << shift
    return scaled
