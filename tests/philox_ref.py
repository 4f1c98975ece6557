"""Philox4x32-10 in plain Python: the reference of csrc/kernels/philox.h and the coins of the
``*_philox`` ops (``philox_uniforms``), checked against the Random123 known answers in
``test_cuda_philox.py``.
"""

from __future__ import annotations

import torch


_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al. 2011) in plain Python: the reference of csrc/kernels/philox.h."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & _MASK32, (k1 + 0xBB67AE85) & _MASK32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _MASK32, p1 & _MASK32, ((p0 >> 32) ^ c3 ^ k1) & _MASK32, p0 & _MASK32
    return c0, c1, c2, c3


def philox_uniforms(seed: int, offset: int, B: int, gamma: int) -> torch.Tensor:
    """The coins [B, gamma+1] of the Philox ops: counter (column // 2, row, offset lo, offset hi),
    key (seed lo, seed hi), two 53-bit doubles per call."""
    seed &= (1 << 64) - 1
    offset &= (1 << 64) - 1
    out = torch.empty(B, gamma + 1, dtype=torch.float64)
    for b in range(B):
        for i in range(gamma + 1):
            w = philox4x32_10((i >> 1, b, offset & _MASK32, offset >> 32), (seed & _MASK32, seed >> 32))
            hi, lo = (w[2], w[3]) if i & 1 else (w[0], w[1])
            out[b, i] = ((hi << 32 | lo) >> 11) * 2.0**-53
    return out
